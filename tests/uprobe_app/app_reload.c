/* A uprobe on getppid, the GOT slot of library ARGV[1] (libreload.c) patched; that library closed and ARGV[2]
 * opened, at its address as the loader reuses the hole, and called; then the probe detached. Prints "base
 * same|moved runs N" (the probe's runs: one call from each library) and "getpid ok|wrong" (ARGV[2]'s
 * call_getpid after the detach). The shim's C API by dlsym: no runtime. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>

#include "egpu_shim.h"
#include "egpu_launchvm.h"
#include "egpu_uprobe.h"

#define API(name) __typeof__(&name) p_##name = dlsym(RTLD_DEFAULT, #name)

int main(int argc, char **argv) {
    API(egpu_lvm_prog_new); API(egpu_lvm_prog_stats); API(egpu_uprobe_attach); API(egpu_uprobe_detach);
    if (argc != 3 || !p_egpu_lvm_prog_new || !p_egpu_lvm_prog_stats || !p_egpu_uprobe_attach || !p_egpu_uprobe_detach)
        return 2;
    static const unsigned char code[] = {0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0}; /* r0 = 0; exit */
    struct egpu_lvm_prog *p = p_egpu_lvm_prog_new(code, 2, NULL, 0);
    int ret = 0;
    void *a = dlopen(argv[1], RTLD_NOW);
    if (!p || !a || p_egpu_uprobe_attach("libc.so.6", "getppid", &p, &ret, 1)) return 3;
    int (*fa)(void) = (int (*)(void))dlsym(a, "call_getppid");
    Dl_info da, db;
    if (!fa || !dladdr((void *)fa, &da)) return 4;
    void *base = da.dli_fbase;
    fa();
    dlclose(a);
    void *b = dlopen(argv[2], RTLD_NOW);
    int (*fb)(void) = b ? (int (*)(void))dlsym(b, "call_getppid") : NULL; /* this dlsym patches b */
    if (!fb || !dladdr((void *)fb, &db)) return 5;
    fb();
    struct egpu_lvm_stats st;
    p_egpu_lvm_prog_stats(p, &st);
    printf("base %s runs %llu\n", db.dli_fbase == base ? "same" : "moved", st.runs);
    p_egpu_uprobe_detach(&p, 1);
    int (*pid)(void) = (int (*)(void))dlsym(b, "call_getpid");
    printf("getpid %s\n", !pid || pid() == getpid() ? "ok" : "wrong");
    return 0;
}
