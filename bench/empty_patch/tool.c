/* The sanitizer's own cost, with nothing of egpu's in the way (bench/bench_sass_sweep.py): a Compute
 * Sanitizer tool, injected through CUDA_INJECTION64_PATH, that patches every module at block enter and
 * exit with EMPTY_PATCH_IMAGE's functions EMPTY_PATCH_ENTER and EMPTY_PATCH_EXIT. With patches.cu they
 * return at once, so what the kernel loses is the patching mechanism's; egpu's floor set beside it says
 * what egpu's patch functions add. A failed call prints to stderr and exits 3; at exit it says how many modules it patched. */
#include <sanitizer.h>
#include <stdio.h>
#include <stdlib.h>

static Sanitizer_SubscriberHandle subscriber;
static __thread int adding;  /* the patch image's own MODULE_LOADED */
static CUcontext added_to;   /* the bench has one context */
static int patched;          /* modules: said at exit, so a run that patched nothing shows it */

static void say_patched(void) { fprintf(stderr, "empty_patch: %d modules patched\n", patched); }

static void must(SanitizerResult r, const char *call) {
    if (r == SANITIZER_SUCCESS) return;
    const char *s = "?";
    sanitizerGetResultString(r, &s);
    fprintf(stderr, "empty_patch: %s failed: %s\n", call, s);
    exit(3);
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
    must(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_BLOCK_ENTER, m->module, getenv("EMPTY_PATCH_ENTER")),
         "sanitizerPatchInstructions(enter)");
    must(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_BLOCK_EXIT, m->module, getenv("EMPTY_PATCH_EXIT")),
         "sanitizerPatchInstructions(exit)");
    must(sanitizerPatchModule(m->module), "sanitizerPatchModule");
    patched++;
}

int InitializeInjection(void) {
    must(sanitizerSubscribe(&subscriber, on_callback, NULL), "sanitizerSubscribe");
    must(sanitizerEnableDomain(1, subscriber, SANITIZER_CB_DOMAIN_RESOURCE), "sanitizerEnableDomain");
    atexit(say_patched);
    return 1;
}
