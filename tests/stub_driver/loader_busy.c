/* app_vfork_exec's library: its constructor, run inside dlopen (the loader's lock held), says so on one pipe
 * and waits for a byte on the other (LOADER_BUSY_FDS: "WRITE READ"). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void wait_for_go(void) {
    int ready, go;
    char c;
    const char *fds = getenv("LOADER_BUSY_FDS");
    if (!fds || sscanf(fds, "%d %d", &ready, &go) != 2) return;
    if (write(ready, "r", 1) != 1 || read(go, &c, 1) != 1) return;
}
