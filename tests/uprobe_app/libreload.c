/* tests/uprobe_app/app_reload.c's libraries: call_getppid imports getppid through the GOT. With -DOTHER, getpid
 * is imported first, and its slot is where the other build's getppid slot is. */
#include <unistd.h>

#ifdef OTHER
int call_getpid(void) { return getpid(); }
#endif
int call_getppid(void) { return getppid(); }
