/* The sanitizer's own cost, with nothing of egpu's in the way (bench/bench_sass.py, bench_sass_sweep.py): a
 * Compute Sanitizer tool, injected through CUDA_INJECTION64_PATH, that patches every module with
 * EMPTY_PATCH_IMAGE's functions: EMPTY_PATCH_ENTER at block enter, EMPTY_PATCH_EXIT at block exit,
 * EMPTY_PATCH_MEM at every global memory access, each only when set. With patches.cu they return at once,
 * so what the kernels lose is the patching mechanism's. A failed call prints to stderr and exits 3; at
 * exit it prints "BENCH_TOOL_PATCHED n" (modules patched) on stdout, so a run that patched nothing shows.
 *
 * With EMPTY_PATCH_SUBSCRIBE set it patches nothing and only subscribes, for what egpu's standby costs
 * (bench/bench_torch_shim.py): "none" enables no callback, "resource" the whole resource domain, "loads"
 * the module load and unload callbacks alone; at exit "BENCH_TOOL_SEEN n" counts the loads called back. */
#include <sanitizer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static Sanitizer_SubscriberHandle subscriber;
static __thread int adding;  /* the patch image's own MODULE_LOADED */
static CUcontext added_to;   /* the benches have one context */
static int patched, seen;

static void say_patched(void) {
    printf("BENCH_TOOL_PATCHED %d\nBENCH_TOOL_SEEN %d\n", patched, seen);
    fflush(stdout);
}

static void must(SanitizerResult r, const char *call) {
    if (r == SANITIZER_SUCCESS) return;
    const char *s = "?";
    sanitizerGetResultString(r, &s);
    fprintf(stderr, "empty_patch: %s failed: %s\n", call, s);
    exit(3);
}

static void patch(Sanitizer_InstructionId id, CUmodule module, const char *setting) {
    const char *name = getenv(setting);
    if (name && *name) must(sanitizerPatchInstructions(id, module, name), "sanitizerPatchInstructions");
}

static void SANITIZERAPI on_callback(void *userdata, Sanitizer_CallbackDomain domain, Sanitizer_CallbackId cbid,
                                     const void *data) {
    (void)userdata;
    if (domain != SANITIZER_CB_DOMAIN_RESOURCE || cbid != SANITIZER_CBID_RESOURCE_MODULE_LOADED || adding) return;
    seen++;
    if (getenv("EMPTY_PATCH_SUBSCRIBE")) return;
    const Sanitizer_ResourceModuleData *m = data;
    if (added_to != m->context) {
        adding = 1;
        must(sanitizerAddPatchesFromFile(getenv("EMPTY_PATCH_IMAGE"), m->context), "sanitizerAddPatchesFromFile");
        adding = 0;
        added_to = m->context;
    }
    patch(SANITIZER_INSTRUCTION_BLOCK_ENTER, m->module, "EMPTY_PATCH_ENTER");
    patch(SANITIZER_INSTRUCTION_BLOCK_EXIT, m->module, "EMPTY_PATCH_EXIT");
    patch(SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS, m->module, "EMPTY_PATCH_MEM");
    must(sanitizerPatchModule(m->module), "sanitizerPatchModule");
    patched++;
}

static void enable_loads(void) {
    must(sanitizerEnableCallback(1, subscriber, SANITIZER_CB_DOMAIN_RESOURCE, SANITIZER_CBID_RESOURCE_MODULE_LOADED),
         "sanitizerEnableCallback");
    must(sanitizerEnableCallback(1, subscriber, SANITIZER_CB_DOMAIN_RESOURCE,
                                 SANITIZER_CBID_RESOURCE_MODULE_UNLOAD_STARTING), "sanitizerEnableCallback");
}

int InitializeInjection(void) {
    const char *only = getenv("EMPTY_PATCH_SUBSCRIBE");
    must(sanitizerSubscribe(&subscriber, on_callback, NULL), "sanitizerSubscribe");
    if (!only || !strcmp(only, "resource"))
        must(sanitizerEnableDomain(1, subscriber, SANITIZER_CB_DOMAIN_RESOURCE), "sanitizerEnableDomain");
    else if (!strcmp(only, "loads"))
        enable_loads();
    else if (strcmp(only, "none")) {
        fprintf(stderr, "empty_patch: EMPTY_PATCH_SUBSCRIBE is none, resource or loads, not %s\n", only);
        exit(3);
    }
    atexit(say_patched);
    return 1;
}
