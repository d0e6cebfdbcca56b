/* A uprobe on libver.so's ver_get (its default version, ver_get@@VER_2) while this program imports both
 * versions through PLT slots not bound yet (lazy binding): prints "new N old M runs R", what each version's
 * call returned and how often the probe ran. The slot importing ver_get@VER_1 must keep calling that one.
 * The shim's C API by dlsym: no runtime. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

#include "egpu_shim.h"
#include "egpu_launchvm.h"
#include "egpu_uprobe.h"

#define API(name) __typeof__(&name) p_##name = dlsym(RTLD_DEFAULT, #name)

int ver_get(void);
int ver_get_old(void);
__asm__(".symver ver_get_old, ver_get@VER_1");

int main(void) {
    API(egpu_lvm_prog_new); API(egpu_lvm_prog_stats); API(egpu_uprobe_attach);
    if (!p_egpu_lvm_prog_new || !p_egpu_lvm_prog_stats || !p_egpu_uprobe_attach) return 2;
    static const unsigned char code[] = {0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0}; /* r0 = 0; exit */
    struct egpu_lvm_prog *p = p_egpu_lvm_prog_new(code, 2, NULL, 0);
    int ret = 0;
    if (!p || p_egpu_uprobe_attach("libver.so", "ver_get", &p, &ret, 1)) return 3;
    int now = ver_get(), old = ver_get_old();
    struct egpu_lvm_stats st;
    p_egpu_lvm_prog_stats(p, &st);
    printf("new %d old %d runs %llu\n", now, old, st.runs);
    return 0;
}
