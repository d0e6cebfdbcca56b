/* The sanitizer's own cost, with nothing of egpu's in the way (bench/bench_sass.py, bench_sass_sweep.py): a
 * Compute Sanitizer tool, injected through CUDA_INJECTION64_PATH, that patches every module with
 * EMPTY_PATCH_IMAGE's functions: EMPTY_PATCH_ENTER at block enter, EMPTY_PATCH_EXIT at block exit,
 * EMPTY_PATCH_MEM at every global memory access, each only when set. With patches.cu they return at once,
 * so what the kernels lose is the patching mechanism's. A failed call prints to stderr and exits 3; at
 * exit it prints "BENCH_TOOL_PATCHED n" (modules patched) on stdout, so a run that patched nothing shows. */
#include <sanitizer.h>
#include <stdio.h>
#include <stdlib.h>

static Sanitizer_SubscriberHandle subscriber;
static __thread int adding;  /* the patch image's own MODULE_LOADED */
static CUcontext added_to;   /* the benches have one context */
static int patched;

static void say_patched(void) {
    printf("BENCH_TOOL_PATCHED %d\n", patched);
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

int InitializeInjection(void) {
    must(sanitizerSubscribe(&subscriber, on_callback, NULL), "sanitizerSubscribe");
    must(sanitizerEnableDomain(1, subscriber, SANITIZER_CB_DOMAIN_RESOURCE), "sanitizerEnableDomain");
    atexit(say_patched);
    return 1;
}
