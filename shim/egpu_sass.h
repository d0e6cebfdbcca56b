/* egpu_sass.h: the SASS back end's interface in libegpu_shim.so (shim/sass.c), cut into the same three
 * parts as egpu_shim.h (shim/build.py hands part 1 to embedding_api(), part 2 to cdef()).
 *
 * The Compute Sanitizer patching API (libsanitizer-public.so, dlopened at run time) patches the SASS of
 * modules without PTX with egpu_preload/translate/sass_patch.py's patch module. docs/sass-backend.md
 * describes the arrangement: the subscription is made in the shim's cuInit hook, before the driver
 * starts, because a subscription made after CUDA ran sees no launches. */
#ifndef EGPU_SASS_H
#define EGPU_SASS_H
#include <stddef.h>

/* ---- part 1: implemented in Python (embedding_api) ---- */

/* A kernel of a SASS-patched module launches and the shim has not seen this function yet: which
 * kernel-site programs run in it (bit k = sass_patch.PatchProgram.bit; 0: none, its launches run
 * without probe calls) and, in *kernel_id, ctx.kernel_id. Called from the sanitizer's launch
 * callback, inside the driver's launch call: it must not call CUDA. */
unsigned long long egpu_py_sass_kernel(void *module, const char *name, unsigned long long *kernel_id);

/* ---- part 2: C API for the runtime (cdef) ---- */

/* What became of the sanitizer, for `egpu modules` and the dump. */
struct egpu_sass_stats {
    int state;                          /* 0 not started, 2 subscribed, 3 off (backend ptx), -1 failed */
    unsigned long long modules_seen;    /* MODULE_LOADED callbacks */
    unsigned long long modules_patched;
    unsigned long long modules_skipped; /* already instrumented by the PTX back end */
    unsigned long long launches;        /* launch callbacks of patched modules */
    unsigned long long probed;          /* of those, launches that ran probes (a record was written) */
    unsigned long long errors;          /* failed sanitizer calls; the first is in `error` */
    char error[256];
};

/* The patch image (a cubin from sass_patch.build_image; copied) and the instruction classes to patch
 * (bit 1 << Sanitizer_InstructionId). Modules that loaded before are patched now. Returns 0, or -1
 * when the sanitizer is not subscribed or the image was configured already. */
int egpu_sass_configure(const void *image, size_t size, unsigned int classes);
/* The global address of the table block (each probe object's map table, back to back): launches
 * run probes only once it is set. */
void egpu_sass_tables(unsigned long long tables);
void egpu_sass_stats(struct egpu_sass_stats *out);

/* ---- part 3: C only ---- */

/* Subscribe when EGPU_BACKEND is sass or auto (once; the shim's cuInit hook calls it). */
void egpu_sass_start(void);
/* The launch id the shim's launch hook drew on this thread, for the launch callback that follows. */
extern __thread unsigned long long egpu_sass_launch_id;

#endif /* EGPU_SASS_H */
