/* tests/uprobe_app/app_version.c's library: ver_get in two versions, as glibc keeps old ones of its functions
 * (pthread_cond_wait@GLIBC_2.2.5 beside @@GLIBC_2.3.2): ver_get@VER_1 returns 1, the default ver_get@@VER_2 2.
 * Versions from libver.map. */
int ver_get_1(void) { return 1; }
int ver_get_2(void) { return 2; }
__asm__(".symver ver_get_1, ver_get@VER_1");
__asm__(".symver ver_get_2, ver_get@@VER_2");
