/* A stand-in libsanitizer-public.so for CI (no GPU, no Compute Sanitizer): every function the shim's
 * SASS back end resolves (shim/sass.c SAN_FNS) succeeds and logs "<pid> <name> ..." to the file named by
 * EGPU_STUB_LOG, as the stand-in driver does. It never calls back: modules are never reported loaded,
 * so nothing is patched; what the tests check is the subscription and the runtime's configuration.
 * EGPU_STUB_SANITIZER_FAIL=<name> makes that function return 7 (SANITIZER_ERROR_OUT_OF_MEMORY). */
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
    va_list ap;
    va_start(ap, fmt);
    fprintf(f, "%d ", (int)getpid());
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    va_end(ap);
    fclose(f);
}

static int result(const char *name) {
    const char *fail = getenv("EGPU_STUB_SANITIZER_FAIL");
    return fail && !strcmp(fail, name) ? 7 : 0;
}

#define CALL(name, fmt, ...) logf_(#name " " fmt, __VA_ARGS__); return result(#name)

static char ring[1 << 20];

int sanitizerSubscribe(void **sub, void *cb, void *ud) { *sub = (void *)1; CALL(sanitizerSubscribe, "cb=%d", cb != NULL); }
int sanitizerEnableDomain(uint32_t on, void *sub, int domain) { CALL(sanitizerEnableDomain, "on=%u domain=%d", on, domain); }
int sanitizerAddPatches(const void *image, void *ctx) { CALL(sanitizerAddPatches, "elf=%d", !memcmp(image, "\177ELF", 4)); }
int sanitizerPatchInstructions(int id, void *m, const char *name) { CALL(sanitizerPatchInstructions, "id=%d name=%s", id, name); }
int sanitizerPatchModule(void *m) { CALL(sanitizerPatchModule, "%s", "-"); }
int sanitizerUnpatchModule(void *m) { CALL(sanitizerUnpatchModule, "%s", "-"); }
int sanitizerAlloc(void *ctx, void **p, size_t n) { *p = ring; CALL(sanitizerAlloc, "size=%zu", n); }
int sanitizerMemcpyHostToDeviceAsync(void *d, void *s, size_t n, void *st) { CALL(sanitizerMemcpyHostToDeviceAsync, "n=%zu", n); }
int sanitizerSetLaunchCallbackData(void *l, void *f, void *s, const void *ud) { CALL(sanitizerSetLaunchCallbackData, "%s", "-"); }
int sanitizerGetFunctionPcAndSize(void *m, const char *n, uint64_t *pc, uint64_t *size) { *pc = 0; *size = 0; CALL(sanitizerGetFunctionPcAndSize, "%s", n); }
int sanitizerGetResultString(int r, const char **s) { *s = r == 7 ? "SANITIZER_ERROR_OUT_OF_MEMORY" : "?"; return 0; }
