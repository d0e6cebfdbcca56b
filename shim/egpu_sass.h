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

/* Which of generation `generation`'s kernel-site programs run in kernel `name` of `module` (bit k =
 * sass_patch.PatchProgram.bit; 0: none, its launches run without probe calls) and, in *kernel_id,
 * ctx.kernel_id. Asked at a module's load about the generation current then (none of its kernels running
 * a program: the module is left unpatched) and at a kernel's first launch under a generation, for kernels
 * the generation's table does not hold; from the sanitizer's callbacks, inside the driver's load or
 * launch call, with no lock of the shim held: it must not call CUDA. ~0: no answer (Python failed, or its
 * runtime is not up): the module is patched all the same, the kernel runs none (hooks.py SASS_UNKNOWN). */
unsigned long long egpu_py_sass_kernel(void *module, const char *name, unsigned long long generation,
                                       unsigned long long *kernel_id);

/* ---- part 2: C API for the runtime (cdef) ---- */

/* What became of the sanitizer, for `egpu modules` and the dump. */
struct egpu_sass_stats {
    int state;                          /* 0 not started, 2 subscribed, 3 off (backend ptx), 4 gave the
                                           tool slot to CUPTI (egpu_sass_yield), -1 failed */
    unsigned long long modules_seen;    /* MODULE_LOADED callbacks */
    unsigned long long modules_patched;
    unsigned long long modules_skipped; /* already instrumented by the PTX back end */
    unsigned long long modules_unselected; /* of those loaded, left unpatched by the current generation:
                                              none of their kernels runs a program of it */
    unsigned long long launches;        /* launch callbacks of patched modules */
    unsigned long long probed;          /* of those, launches that ran probes (a record was written) */
    unsigned long long errors;          /* failed sanitizer calls; the last is in `error` */
    unsigned long long flips;           /* generations committed */
    unsigned long long asked;           /* launch callbacks that asked Python for a kernel's programs */
    unsigned long long flip_us;         /* the last commit's unpatching and re-patching */
    unsigned long long drain_us;        /* the last flip's drain of the patched contexts, before it */
    unsigned long long generation;      /* the one patching now (0: none since the start) */
    unsigned long long modules_loaded;  /* modules the back end may patch (loaded, not the PTX back end's) */
    unsigned long long patched_now;     /* of those, patched with the current generation */
    unsigned long long other_context;   /* launches of patched modules in another context than the maps'
                                           (another GPU's): given no record, their patches run no probe */
    char error[256];
};

/* A generation to stage: the patch image (a cubin from sass_patch.build_image; copied; `image_id` names
 * it, so an image is added to a context once), the instruction classes it patches (bit 1 <<
 * Sanitizer_InstructionId; 0: none, standby again), its entry point for each class (entries[id]), its
 * table block, and what its programs are in every kernel the runtime was asked about so far (names[k]:
 * masks[k], kernel_ids[k]; copied), so that launches after the flip need no call into Python for them. */
struct egpu_sass_generation {
    const void *image;
    size_t size;
    unsigned int classes;
    const char *const *entries;
    unsigned long long image_id, id, tables;
    const char *const *names;
    const unsigned long long *masks, *kernel_ids;
    size_t nkernels;
    int evaluates;   /* launches count for the programs its masks leave out (egpu_shim_eval) while it patches */
};

/* Stage generation `in->id`. It replaces any staged one; egpu_sass_commit_now or the next
 * egpu_shim_swap commits it. -1: the sanitizer is not subscribed, or out of memory. */
int egpu_sass_stage(const struct egpu_sass_generation *in);
void egpu_sass_unstage(void);
/* Commit the staged generation now: only while no module is patched (a first patch needs no drain).
 * 0, or -1 with the reason in the stats' error. */
int egpu_sass_commit_now(void);
/* The current generation's table block (each probe object's map table, back to back), when it was
 * staged without one: launches run probes only once it is set. */
void egpu_sass_tables(unsigned long long tables);
/* The context the maps and table blocks live in. A launch in another one (another GPU's, or a second
 * context on the same one) gets no record, so its patches return at once: the tables' memory would be an
 * illegal address for its kernels. Until it is set, no launch gets a record (no table block exists). */
void egpu_sass_maps_context(void *ctx);
void egpu_sass_stats(struct egpu_sass_stats *out);
/* The kernels of every module loaded (those the back end may patch), each name followed by a NUL, into
 * `out` as far as `size` bytes hold whole names; the bytes all of them need. A generation staged with them
 * in its table weighs those modules without asking Python at the flip. */
size_t egpu_sass_kernel_names(char *out, size_t size);
/* Unsubscribe in standby so a CUPTI client (named by `to`) can have the driver's one tool slot; the
 * SASS back end is off from then on (state 4). 0: yielded or not subscribed; -1: a generation patches
 * or is staged, and the sanitizer keeps the slot. */
int egpu_sass_yield(const char *to);

/* ---- part 3: C only ---- */

/* Subscribe when EGPU_BACKEND is sass or auto (once; the shim's cuInit hook calls it). */
void egpu_sass_start(void);
/* 1 while the sanitizer is subscribed and holds the driver's tool slot (standby or patching). */
int egpu_sass_holds_slot(void);
/* Commit the staged generation, if any: every context drained, every module re-patched. Called by
 * egpu_shim_swap inside its launch gate; 0, or -1 with the old generation still patched. */
int egpu_sass_flip(void);
/* After a module or library unload returned (the shim's hooks): launch callbacks off when the last
 * patched module went with it. */
void egpu_sass_unloaded(void);
/* The context egpu_sass_maps_context set (NULL: none yet). */
void *egpu_sass_maps_ctx(void);
/* The launch id the shim's launch hook drew on this thread, for the launch callback that follows. */
extern __thread unsigned long long egpu_sass_launch_id;

#endif /* EGPU_SASS_H */
