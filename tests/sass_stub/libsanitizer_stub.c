/* A stand-in libsanitizer-public.so for CI (no GPU, no Compute Sanitizer): every function the shim's
 * SASS back end resolves (shim/sass.c SAN_FNS) logs "<pid> <name> ..." to the file named by
 * EGPU_STUB_LOG, as the stand-in driver does, and succeeds, except as told:
 * - EGPU_STUB_SANITIZER_FAIL=<name> makes that function return 7 (SANITIZER_ERROR_OUT_OF_MEMORY);
 *   <name>:<n> only its n-th call.
 * Where the stand-in driver is loaded (tests/stub_driver: egpu_stub_sanitizer), it calls back as the
 * real one does: MODULE_LOADED at every load, LAUNCH_BEGIN at every launch, each while its domain is
 * enabled. Patches are kept per module as the real API keeps them (sanitizerPatchInstructions stages,
 * sanitizerPatchModule applies, sanitizerUnpatchModule removes; staging over an applied patch fails:
 * on the GPU that breaks the module). After each LAUNCH_BEGIN it logs what the launch would run:
 *   run f=<kernel> enter=<block-enter entry, or -> record=<generation>:<launch id>:<mask>, or ->
 * the record being the userdata the launch was given, copied there by sanitizerMemcpyHostToDeviceAsync.
 * At a graph replay (the stand-in driver's event 99) it logs what each module patched so far would run:
 *   graph run enter=<module 1's block-enter entry, or ->,<module 2's>,...
 * Two knobs make races visible:
 * - EGPU_STUB_SANITIZER_DELAY_US=<us>: sanitizerPatchModule takes that long (a re-patch takes a while);
 * - EGPU_STUB_SANITIZER_LOAD_IN=<n>: the n-th sanitizerPatchModule loads a module through the driver on
 *   another thread and waits for that load to end, as the real one would wait for a driver lock the
 *   loading thread holds; after 2 s it gives up and logs "sanitizerPatchModule: deadlock". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void logf_(const char *fmt, ...) {
    const char *path = getenv("EGPU_STUB_LOG");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (!f) return;
    char line[1024];
    int n = snprintf(line, sizeof line, "%d ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2) n = sizeof line - 2;
    line[n++] = '\n';
    fwrite(line, 1, n, f); /* one write per line */
    fclose(f);
}

static int result(const char *name) {
    static int calls[16];
    static const char *names[16];
    const char *fail = getenv("EGPU_STUB_SANITIZER_FAIL");
    if (!fail) return 0;
    size_t len = strcspn(fail, ":");
    if (strlen(name) != len || strncmp(fail, name, len)) return 0;
    if (!fail[len]) return 7;
    int k = 0;
    while (k < 15 && names[k] && strcmp(names[k], name)) k++;
    names[k] = name;
    return ++calls[k] == atoi(fail + len + 1) ? 7 : 0;
}

#define CALL(name, fmt, ...) do { \
        int r_ = result(#name); logf_(#name " " fmt "%s", __VA_ARGS__, r_ ? " -> 7" : ""); return r_; \
    } while (0)

typedef void (*callback)(void *userdata, int domain, uint32_t cbid, const void *data);
static callback subscriber;
static void *subscriber_data;
static unsigned char enabled[8][64]; /* per domain and callback id, as the real API keeps them */

/* Sanitizer_LaunchData as the stand-in driver lays it out */
struct launch_data {
    void *ctx, *stream, *hstream, *module, *function;
    const char *name;
    unsigned int grid[3], block[3], cluster[3];
    unsigned long long grid_id;
    void *launch;
};
struct record { unsigned long long kernel_id, launch_id, start, mask, tables, generation, pad[2]; };

#define MODULES 64
static struct patched { void *module; char staged[4][96], applied[4][96]; int on; } modules[MODULES];
static __thread const void *launch_userdata;

static struct patched *module_of(void *m) {
    for (int i = 0; i < MODULES; i++)
        if (modules[i].module == m) return &modules[i];
    for (int i = 0; i < MODULES; i++)
        if (!modules[i].module) {
            modules[i].module = m;
            return &modules[i];
        }
    return NULL;
}

static void graph_run(void) {
    char line[512] = "";
    size_t at = 0;
    for (int i = 0; i < MODULES && modules[i].module && at < sizeof line - 100; i++)
        at += snprintf(line + at, sizeof line - at, "%s%s", i ? "," : "",
                       modules[i].on && modules[i].applied[1][0] ? modules[i].applied[1] : "-");
    logf_("graph run enter=%s", line);
}

static void event(int domain, unsigned int cbid, const void *data) {
    if (domain == 99) {
        graph_run();
        return;
    }
    if (!subscriber || domain < 0 || domain >= 8 || cbid >= 64 || !enabled[domain][cbid]) return;
    if (domain != 5) {
        subscriber(subscriber_data, domain, cbid, data);
        return;
    }
    const struct launch_data *ld = data;
    launch_userdata = NULL;
    subscriber(subscriber_data, domain, cbid, data);
    struct patched *p = module_of(ld->module);
    const char *enter = p && p->on && p->applied[1][0] ? p->applied[1] : "-";
    const struct record *r = launch_userdata;
    if (r) logf_("run f=%s enter=%s record=%llu:%llu:%llu", ld->name, enter, r->generation, r->launch_id, r->mask);
    else logf_("run f=%s enter=%s record=-", ld->name, enter);
}

typedef int (*load_fn)(void **module, const void *image);
static load_fn driver_load; /* the driver's own cuModuleLoadData (resolved while the shim passes us through) */

static void *load_module(void *done) {
    static const char ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry late()\n{\n\tret;\n}\n";
    void *m = NULL;
    int r = driver_load ? driver_load(&m, ptx) : -1;
    logf_("load on another thread -> %d", r);
    __atomic_store_n((int *)done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/* EGPU_STUB_SANITIZER_LOAD_IN: a load on another thread, waited for (at most 2 s) */
static void load_meanwhile(void) {
    static int calls;
    const char *at = getenv("EGPU_STUB_SANITIZER_LOAD_IN");
    if (!at || ++calls != atoi(at)) return;
    static int done;
    pthread_t t;
    if (pthread_create(&t, NULL, load_module, &done)) return;
    for (int ms = 0; ms < 2000 && !__atomic_load_n(&done, __ATOMIC_SEQ_CST); ms++) usleep(1000);
    if (__atomic_load_n(&done, __ATOMIC_SEQ_CST)) pthread_join(t, NULL);
    else {
        logf_("sanitizerPatchModule: deadlock (the load on another thread waits for this call)");
        pthread_detach(t);
    }
}

int sanitizerSubscribe(void **sub, callback cb, void *ud) {
    subscriber = cb, subscriber_data = ud;
    *sub = (void *)1;
    void *driver = dlopen("libcuda.so.1", RTLD_NOW);
    driver_load = driver ? (load_fn)dlsym(driver, "cuModuleLoadData") : NULL;
    void (*reg)(void (*)(int, unsigned int, const void *)) = driver ? dlsym(driver, "egpu_stub_sanitizer") : NULL;
    if (reg) reg(event);
    CALL(sanitizerSubscribe, "cb=%d", cb != NULL);
}
int sanitizerUnsubscribe(void *sub) {
    subscriber = NULL;
    CALL(sanitizerUnsubscribe, "sub=%d", sub != NULL);
}
/* The driver's one tool slot, for the stand-in CUPTI (libcupti_stub.c). */
int egpu_stub_sanitizer_subscribed(void) { return subscriber != NULL; }
int sanitizerEnableDomain(uint32_t on, void *sub, int domain) {
    if (domain >= 0 && domain < 8) memset(enabled[domain], on != 0, sizeof enabled[domain]);
    CALL(sanitizerEnableDomain, "on=%u domain=%d", on, domain);
}
int sanitizerEnableCallback(uint32_t on, void *sub, int domain, uint32_t cbid) {
    if (domain >= 0 && domain < 8 && cbid < 64) enabled[domain][cbid] = on != 0;
    CALL(sanitizerEnableCallback, "on=%u domain=%d cbid=%u", on, domain, cbid);
}
int sanitizerAddPatches(const void *image, void *ctx) {
    CALL(sanitizerAddPatches, "elf=%d", !memcmp(image, "\177ELF", 4));
}
int sanitizerPatchInstructions(int id, void *m, const char *name) {
    struct patched *p = module_of(m);
    if (p && p->on) {
        logf_("sanitizerPatchInstructions id=%d name=%s: the module is patched already -> 7", id, name);
        return 7;
    }
    if (p && id > 0 && id < 4) snprintf(p->staged[id], sizeof p->staged[id], "%s", name);
    CALL(sanitizerPatchInstructions, "id=%d name=%s", id, name);
}
int sanitizerPatchModule(void *m) {
    const char *delay = getenv("EGPU_STUB_SANITIZER_DELAY_US");
    if (delay) usleep(atoi(delay));
    load_meanwhile();
    struct patched *p = module_of(m);
    int r = result("sanitizerPatchModule");
    logf_("sanitizerPatchModule %s", r ? "-> 7" : "-");
    if (!r && p) {
        memcpy(p->applied, p->staged, sizeof p->applied);
        p->on = 1;
    }
    if (p) memset(p->staged, 0, sizeof p->staged);
    return r;
}
int sanitizerUnpatchModule(void *m) {
    struct patched *p = module_of(m);
    if (p) {
        p->on = 0;
        memset(p->applied, 0, sizeof p->applied);
    }
    CALL(sanitizerUnpatchModule, "%s", "-");
}
static char ring[1 << 20];
int sanitizerAlloc(void *ctx, void **p, size_t n) { *p = ring; CALL(sanitizerAlloc, "size=%zu", n); }
int sanitizerMemcpyHostToDeviceAsync(void *d, void *s, size_t n, void *st) {
    memcpy(d, s, n);
    CALL(sanitizerMemcpyHostToDeviceAsync, "n=%zu", n);
}
int sanitizerSetLaunchCallbackData(void *l, void *f, void *s, const void *ud) {
    launch_userdata = ud;
    CALL(sanitizerSetLaunchCallbackData, "%s", "-");
}
int sanitizerGetFunctionPcAndSize(void *m, const char *n, uint64_t *pc, uint64_t *size) {
    *pc = 0;
    *size = 0;
    CALL(sanitizerGetFunctionPcAndSize, "%s", n);
}
int sanitizerGetResultString(int r, const char **s) { *s = r == 7 ? "SANITIZER_ERROR_OUT_OF_MEMORY" : "?"; return 0; }
