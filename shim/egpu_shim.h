/* egpu_shim.h: the one interface of libegpu_shim.so, in three parts.
 *
 * shim/build.py hands part 1 to cffi's embedding_api() (functions implemented in Python by
 * egpu_preload/runtime/hooks.py; the first call starts Python), part 2 to cdef() (the C API the
 * runtime calls through cffi), and set_source() includes the whole file. Part 3 is C only: the
 * driver types and the table of hooked driver entry points.
 *
 * Driver types are declared here, not taken from cuda.h, so the shim builds without the toolkit:
 * CUresult and enums are int, handles are void *, CUdeviceptr is unsigned long long.
 * tests/test_shim.py checks every prototype below against cuda.h where the header exists.
 */
#ifndef EGPU_SHIM_H
#define EGPU_SHIM_H
#include <stddef.h>

/* ---- part 1: implemented in Python (embedding_api) ---- */

/* Before a module/library load or a PTX link input reaches the driver. `image` is what the app
 * passed (PTX text, cubin, fatbin or fatbin wrapper), or NULL for file loads (then `path`); `size` is
 * the app's size where the API has one, else 0. Returns NULL to load the original, or a replacement
 * image (its size in *out_size) that stays valid until egpu_py_module_loaded() for the same `call`. */
const void *egpu_py_module_load(int api, unsigned long long call, const void *image, size_t size,
                                const char *path, size_t *out_size);
/* After that load: the driver's result and the module, library or link state it made.
 * replacement_result: -1 if no replacement was offered; else the driver's result for the
 * replacement, and when that was an error the original was loaded instead (result, handle).
 * jit_log: the driver's error log for a refused replacement of a module or library load (asked for
 * with CU_JIT_ERROR_LOG_BUFFER beside the app's own JIT options), else "" (link inputs: cuLinkAddData
 * takes no log options; the link's log is the app's). */
void egpu_py_module_loaded(int api, unsigned long long call, void *handle, int result,
                           int replacement_result, const char *jit_log);
/* A successful call that made a handle: cuModuleGetFunction / cuLibraryGetKernel (owner = module /
 * library, name), cuKernelGetFunction (owner = kernel), cuLibraryGetModule (owner = library),
 * cuLinkCreate (handle = link state), cuLinkComplete (owner = link state, handle = cubin). Returns 1
 * when handled (the shim answers that lookup itself from then on), 0 when it failed (asked again). */
int egpu_py_handle_found(int api, void *owner, const char *name, void *handle);
/* A successful cuModuleUnload / cuLibraryUnload (handle is gone). */
void egpu_py_unloaded(int api, void *handle);
/* The process that runs the runtime is about to exec (phase EGPU_EXEC_BEFORE: its image's exit dump, as
 * no exit handler runs at exec), or its exec failed and it goes on (EGPU_EXEC_FAILED: that dump withdrawn,
 * the maps count on). process.c's exec hooks call it, through egpu_python_exec. */
void egpu_py_exec(int phase);
/* A handle's first launch while launches count for programs evaluated at the launch (egpu_shim_eval_set):
 * the runtime answers with egpu_shim_eval_set for `handle`, or, where it cannot, ends the counting (a flip
 * whose generation patches those programs). Before the launch gate. Returns 0; else (Python failed) the
 * handle's launches add nothing. */
int egpu_py_eval_handle(void *handle);
/* `why` (a hooked call that begins a stream capture or makes a graph node) is about to reach the driver
 * while launches count: graphs replay launches no hook sees, so the runtime ends the counting first. */
void egpu_py_eval_end(const char *why);

/* ---- part 2: C API for the runtime (cdef) ---- */

/* Which driver API a callback or launch record comes from. */
enum egpu_api {
    EGPU_API_MODULE_LOAD = 1, EGPU_API_MODULE_LOAD_DATA, EGPU_API_MODULE_LOAD_DATA_EX,
    EGPU_API_MODULE_LOAD_FAT_BINARY, EGPU_API_LIBRARY_LOAD_DATA, EGPU_API_LIBRARY_LOAD_FROM_FILE,
    EGPU_API_LINK_CREATE, EGPU_API_LINK_ADD_DATA, EGPU_API_LINK_ADD_FILE, EGPU_API_LINK_COMPLETE,
    EGPU_API_MODULE_GET_FUNCTION, EGPU_API_LIBRARY_GET_KERNEL, EGPU_API_KERNEL_GET_FUNCTION,
    EGPU_API_LIBRARY_GET_MODULE, EGPU_API_MODULE_UNLOAD, EGPU_API_LIBRARY_UNLOAD,
    EGPU_API_LAUNCH_KERNEL, EGPU_API_LAUNCH_KERNEL_EX, EGPU_API_LAUNCH_COOPERATIVE_KERNEL,
    EGPU_API_GRAPH_KERNEL_NODE
};

/* Allocation kinds in the allocation table. */
enum egpu_alloc_kind {
    EGPU_ALLOC_DEVICE = 1, EGPU_ALLOC_PITCH, EGPU_ALLOC_MANAGED, EGPU_ALLOC_ASYNC, EGPU_ALLOC_HOST,
    EGPU_ALLOC_HOST_REGISTERED, EGPU_ALLOC_VMM_HANDLE, EGPU_ALLOC_VMM_MAPPING
};

/* One launch, as recorded while records are on (egpu_shim_records). */
struct egpu_launch_record {
    unsigned long long launch_id;   /* the process-wide launch counter, as appended to kernels */
    unsigned long long time_ns;     /* CLOCK_MONOTONIC just before the real launch */
    void *function;                 /* the handle the app launched (CUfunction or CUkernel) */
    void *launched;                 /* what reached the driver (the replacement, if registered) */
    void *stream;
    unsigned int grid[3];
    unsigned int block[3];
    unsigned int shared_mem;
    int api;                        /* enum egpu_api */
};

struct egpu_alloc {
    unsigned long long address;     /* device pointer, host pointer or VMM handle */
    unsigned long long size;
    int kind;                       /* enum egpu_alloc_kind */
    unsigned long long seq;         /* creation number, process-wide, freed allocations counted too */
};

struct egpu_stats {
    unsigned long long launches;    /* launch ids drawn: launches through a hook, graph kernel nodes
                                       retargeted (a node's id is fixed when its params are set) */
    unsigned long long redirected;  /* launches that ran a registered replacement */
    unsigned long long records;     /* launch records written */
    unsigned long long dropped;     /* launch records lost to a full ring */
    unsigned long long untracked;   /* launches of functions the full table could not count */
    unsigned long long python_calls;
    unsigned long long refused;     /* launches answered CUDA_ERROR_OUT_OF_MEMORY: no host memory to
                                       append the launch id (the target would read a missing parameter) */
};

/* Launch `repl` whenever the app launches `orig` (a CUfunction or CUkernel handle); repl NULL
 * launches `orig` itself again. One atomic store: concurrent launches see the old or the new
 * target, never a mix. Returns 0, or -1 when the table is full. */
int egpu_shim_register(void *orig, void *repl);
/* The same for a replacement rewritten with a trailing u64 launch-id parameter
 * (translate/rewrite.py): launches append the launch id after `nparams` kernelParams, or write it at
 * byte `param_offset` of a CU_LAUNCH_PARAM_BUFFER_POINTER buffer. */
int egpu_shim_register_launch_id(void *orig, void *repl, unsigned int nparams,
                                 unsigned int param_offset);
/* One device-to-device copy of module state (a __device__ or __constant__ global) for egpu_shim_swap. */
struct egpu_copy {
    unsigned long long dst, src, size;
};
/* One retarget for egpu_shim_swap: as egpu_shim_register (launch_id 0) or
 * egpu_shim_register_launch_id (launch_id 1). */
struct egpu_flip {
    void *orig, *repl;
    unsigned int nparams, param_offset;
    int launch_id;
};
/* One module variable the app addresses in its own image while a copy the runtime loaded serves the
 * module: the app's copies and memsets within [orig, orig + size) go to the same offset of
 * [moved, moved + size), the copy's variable, which its kernels read and write. */
struct egpu_moved {
    unsigned long long orig, moved, size;
};
/* A hot swap no launch straddles: new launches and copies wait at the hooks (those already inside one
 * reach the driver first), context `ctx` finishes everything submitted (cuCtxSynchronize), the copies
 * run (cuMemcpyDtoD) and finish, every flip is published, the table of moved variables is replaced
 * by `moved` (NULL: kept as it is), launches and copies go on. So each launch runs wholly on the old
 * targets or wholly on the new ones, state written by old launches is in the new module before its
 * first launch, and no copy of the app lands in an image after its state was copied out. *launches
 * gets the launch counter at the flip: launch ids up to it ran the old targets, later ones the new.
 * Returns 0; -1 when the table is full or memory is out (nothing published); EGPU_SWAP_CAPTURING while
 * a stream capture the shim saw begin is in progress (nothing drained or published: the driver would
 * refuse the drain and invalidate the capture); EGPU_SWAP_TIMEOUT when a hook still sat in the driver
 * or the context had not drained by egpu_shim_hold_limit (a kernel that runs long, or waits for a later
 * launch and never ends): nothing published, launches and copies went on with the old targets;
 * EGPU_SWAP_SASS when the SASS back end's staged generation could not be patched in (egpu_sass_flip:
 * its old generation stays; nothing published); else the failing CUresult (nothing published). */
enum { EGPU_SWAP_CAPTURING = -2, EGPU_SWAP_TIMEOUT = -3, EGPU_SWAP_SASS = -4 };
int egpu_shim_swap(void *ctx, const struct egpu_copy *copies, size_t ncopies,
                   const struct egpu_flip *flips, size_t nflips, const struct egpu_moved *moved,
                   size_t nmoved, unsigned long long *launches);
/* How long a swap or a checkpoint's cut may hold launches and copies at the hooks, in milliseconds
 * (5000 at start; 0 leaves it as it is); returns the previous limit. */
unsigned int egpu_shim_hold_limit(unsigned int ms);
/* Replace the table of moved variables now, outside a swap (a module loaded or unloaded while copies
 * serve: no copy of the app can address it yet, or any more). Returns 0, or -1 when memory is out. */
int egpu_shim_move(const struct egpu_moved *moved, size_t nmoved);
/* The function launches of `orig` currently reach (orig itself if none registered). */
void *egpu_shim_current(void *orig);
/* 1 if a target of `orig` with `function` (any registered or flipped to since the start, current or
 * not) escaped the launch hooks: it went into a graph kernel node (whose replays never pass a hook) or
 * was launched while a stream capture was in progress (the captured graph keeps it); else 0. A copy
 * none of whose functions escaped is unreachable once a swap moved every handle off it: no launch of
 * it can come later than that swap's drain, so it can be unloaded. */
int egpu_shim_escaped(void *orig, void *function);
/* Launches of `orig` through the hooks so far. */
unsigned long long egpu_shim_launches(void *orig);
void egpu_shim_stats(struct egpu_stats *out);
/* One lane a launch of a handle adds to for a program evaluated at the launch (translate/launch_eval.py). */
struct egpu_eval_add {
    void *lane;                /* 4 or 8 aligned bytes of the runtime's host memory */
    unsigned long long delta;  /* added once for every thread, warp or block the launch runs */
    unsigned int width;        /* 4 or 8: the add wraps at that width */
    unsigned int scope;        /* 0 thread, 1 warp, 2 block */
};
/* What each launch of `handle` the driver takes, in the maps' context, adds while the counting is on
 * (copied; n = 0: nothing). 0, or -1 (no memory, or the table is full: the handle is asked again). */
int egpu_shim_eval_set(void *handle, const struct egpu_eval_add *adds, size_t n);
/* Every handle is asked again at its next launch (an unload: the driver hands its handles out again). */
void egpu_shim_eval_forget(void);
/* 1 while launches count for evaluated programs (the SASS back end's committed generation says so, or the
 * PTX back end began). Every flip (egpu_shim_swap) ends the counting, and it never starts again. */
int egpu_shim_eval_on(void);
/* Launches count for evaluated programs from now on, for the PTX back end's modules: 1, or 0 where the
 * counting ended or may not start (a graph may exist). */
int egpu_shim_eval_begin(void);
/* A module whose kernels launch kernels from the device was loaded (shim/sass.c, or the PTX back end): the
 * next launch that counts ends the counting first (egpu_py_eval_end), since device-side launches pass no hook. */
void egpu_shim_eval_device_launches(void);
/* Turn launch records on (1) or off (0); returns the previous setting. */
int egpu_shim_records(int on);
/* While rings wait for the reader (--trace, --on-full wait): `ctx`, the maps' context, makes whatever may
 * load code wait for that context's work first (interpose.c, "waiting rings"); NULL turns it off. */
void egpu_shim_rings_wait(void *ctx);
/* That wait, for the runtime's own loads and lookups: nothing unless rings wait. */
void egpu_shim_idle(void);
/* A function the runtime looked up after that wait, loaded there too while rings wait under lazy loading
 * (cuFuncLoad), so that its first launch needs no wait of its own. */
void egpu_shim_found(void *function);
/* `kernel`, of a copy the runtime loaded through the library API, is a CUkernel: what the application set on a
 * CUfunction reaches it through its function in the current context. 0, or -1 when the table is full. */
int egpu_shim_kernel_handle(void *kernel);
/* Up to `max` of the JIT options the application gave the load in progress on this thread (called from
 * egpu_py_module_load), those that take a number: into options and values; returns how many. */
unsigned egpu_shim_load_jit(int *options, unsigned long long *values, unsigned max);
/* Move up to `max` launch records into `out` (single consumer); returns how many. */
size_t egpu_shim_drain(struct egpu_launch_record *out, size_t max);
/* Copy up to `max` live allocations into `out`; returns how many there are in all. */
size_t egpu_shim_allocations(struct egpu_alloc *out, size_t max);
/* The driver's own entry point for an exported symbol name ("cuModuleLoadDataEx",
 * "cuLaunchKernel_ptsz", "cuMemAlloc_v2"), never a hook; NULL if the driver lacks it. */
void *egpu_shim_real(const char *symbol);
/* Python is being finalized (hooks.attach registers this with atexit before anything else, so it runs
 * after every other atexit handler of the runtime): from now on no hook calls into Python. Module loads,
 * lookups and unloads go straight to the driver, the SASS back end runs no probes in later launches;
 * launches keep their targets. C exit handlers that run after Py_FinalizeEx (cuDNN's static destructors
 * unload modules) would otherwise call into a finalized interpreter and crash the program. */
void egpu_shim_python_gone(void);
/* While on, this thread's hooks go straight to the driver (no callbacks, no redirection), so the
 * runtime can use any driver binding (cuda-python) itself. Returns the previous setting. Hooks
 * called from inside a Python callback pass straight through anyway. */
int egpu_shim_bypass(int on);
/* Python's os.fork is about to fork this thread (hooks.attach registers it as a before-fork hook): the
 * shim's fork handlers leave the interpreter to Python (process.c). */
void egpu_shim_python_forking(void);
/* The phases of egpu_py_exec. */
enum egpu_exec_phase { EGPU_EXEC_BEFORE, EGPU_EXEC_FAILED };
/* The runtime started in process `pid` (it calls this then): an exec in that process, and in no other (a
 * child it forked or vforked holds its maps' copy, or shares its memory), calls egpu_py_exec first. */
void egpu_shim_exec_owner(int pid);

/* ---- part 3: C only ---- */

/* Launches count for evaluated programs from now on (1: shim/sass.c, as it commits a generation that counts,
 * refused once a graph may exist or the counting ended) or no longer, for good (0: every flip, in its hold). */
void egpu_shim_eval(int on);

/* 0 once egpu_shim_python_gone() was called, or when the process runs a Python other than the shim's
 * (egpu_python_matches): every caller of a part-1 function asks first. */
int egpu_python_up(void);
/* 1 when the process's Python is the version the shim was built for (process.c); else 0, said once. */
int egpu_python_matches(void);
/* 1 once the shim has called into Python (hooks.attach ran) and until egpu_shim_python_gone(). */
int egpu_python_attached(void);
/* Start Python and the runtime now, as a module load would (egpu_hostapi.h egpu_py_start). */
void egpu_python_start(void);
/* egpu_py_exec(phase) where this process is egpu_shim_exec_owner's, its Python up and this thread not inside a
 * callback; returns whether it was called (interpose.c). */
int egpu_python_exec(int phase);
/* Once, in a job that asks for it (EGPU_EARLY_START=1: host-API probes, CUPTI): start the runtime at the
 * process's first CUDA call (the cuInit hook, else the first copy, allocation or sync hook). */
void egpu_python_start_early(void);

/* process.c: if this thread holds the GIL, let it go and return what egpu_gil_take_back needs (NULL:
 * it did not hold it). For a thread about to wait on another that may need the GIL. */
void *egpu_gil_let_go(void);
void egpu_gil_take_back(void *state);
/* process.c: whether this thread holds the GIL. */
int egpu_gil_held(void);
/* process.c: register the fork handlers (once; every hook that reaches the driver calls it). */
void egpu_fork_handlers(void);
/* Each file's part of a fork: PREPARE takes its locks (no table mid-update when the process is copied),
 * PARENT gives them back, CHILD makes them new and resets what belongs to the parent's threads. */
enum egpu_fork_phase { EGPU_FORK_PREPARE, EGPU_FORK_PARENT, EGPU_FORK_CHILD };
void egpu_interpose_fork(enum egpu_fork_phase phase);
void egpu_cow_fork(enum egpu_fork_phase phase);
void egpu_lvm_fork(enum egpu_fork_phase phase);
void egpu_sass_fork(enum egpu_fork_phase phase);

/* The next definition of `name` after the shim (dlsym(RTLD_NEXT) from inside it). */
void *egpu_dlsym_next(const char *name);
/* dlsym itself, past the shim's hook. */
void *egpu_real_dlsym(void *handle, const char *name);
/* cupti.c: the index of a CUPTI function the shim wraps (-1: none), and its wrapper, given what the
 * application's dlsym found (NULL when it found nothing). */
int egpu_cupti_fn(const char *name);
void *egpu_cupti_hand_out(int i, void *found);

/* Nonzero while a stream capture the shim saw begin is in progress (interpose.c, "stream capture"). */
int egpu_shim_capturing(void);
/* Nonzero when this thread's hooks pass straight through (egpu_shim_bypass, or inside a Python callback). */
int egpu_passthrough(void);
/* The driver's `name` as a `type`, looked up once per call site (egpu_shim_real never returns a hook). */
#define EGPU_REAL(type, name) ({ static _Atomic(void *) cache_; \
    void *p_ = atomic_load_explicit(&cache_, memory_order_acquire); \
    if (!p_) { p_ = egpu_shim_real(name); atomic_store_explicit(&cache_, p_, memory_order_release); } \
    (type)p_; })

typedef int CUresult;
typedef void *CUmodule, *CUfunction, *CUlibrary, *CUkernel, *CUlinkState, *CUstream, *CUgraph,
             *CUgraphNode, *CUgraphExec, *CUmemoryPool, *CUcontext;
typedef unsigned long long CUdeviceptr, CUmemGenericAllocationHandle, cuuint64_t;

typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* CUDA_KERNEL_NODE_PARAMS_v1; _v2 appends {CUkernel kern; CUcontext ctx;} */
typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS_v1;
typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams;
    void **extra;
    CUkernel kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;
/* _v3, the kernel member of CUgraphNodeParams, has _v2's fields */
typedef CUDA_KERNEL_NODE_PARAMS_v2 CUDA_KERNEL_NODE_PARAMS_v3;

/* The generic node APIs' tagged union; only a kernel node's member is ever read. */
typedef struct {
    int type; /* CUgraphNodeType */
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_KERNEL_NODE_PARAMS_v3 kernel;
    };
    long long reserved2;
} CUgraphNodeParams;
typedef struct {
    unsigned char from_port, to_port, type, reserved[5];
} CUgraphEdgeData;

#define EGPU_LAUNCH_ARGS(F) F f, unsigned int gridDimX, unsigned int gridDimY, \
    unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, \
    unsigned int sharedMemBytes, CUstream hStream

/* Every hooked driver entry point: X(exported symbol, API name, cudaVersion it appeared in,
 * per-thread-stream variant?, (parameters)). cuGetProcAddress(api, version, flags) hands out the
 * hook of the row the driver itself would pick: the newest version <= the requested one, the
 * per-thread row when flags has CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (cudaTypedefs.h
 * names them PFN_<api>_v<version>[_ptsz]). Older rows with another ABI (cuMemAlloc v2000 with
 * 32-bit pointers) are not hooked and pass through; cuStreamBeginCapture v10000 (one argument, the
 * mode implied) is, since a capture begun any way bakes launches into a graph. */
#define EGPU_HOOKS(X) \
    X(cuGetProcAddress, cuGetProcAddress, 11030, 0, \
      (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)) \
    X(cuGetProcAddress_v2, cuGetProcAddress, 12000, 0, \
      (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags, int *symbolStatus)) \
    X(cuInit, cuInit, 2000, 0, (unsigned int Flags)) \
    X(cuModuleLoad, cuModuleLoad, 2000, 0, (CUmodule *module, const char *fname)) \
    X(cuModuleLoadData, cuModuleLoadData, 2000, 0, (CUmodule *module, const void *image)) \
    X(cuModuleLoadDataEx, cuModuleLoadDataEx, 2010, 0, \
      (CUmodule *module, const void *image, unsigned int numOptions, int *options, void **optionValues)) \
    X(cuModuleLoadFatBinary, cuModuleLoadFatBinary, 2000, 0, (CUmodule *module, const void *fatCubin)) \
    X(cuModuleUnload, cuModuleUnload, 2000, 0, (CUmodule hmod)) \
    X(cuModuleGetFunction, cuModuleGetFunction, 2000, 0, (CUfunction *hfunc, CUmodule hmod, const char *name)) \
    X(cuLibraryLoadData, cuLibraryLoadData, 12000, 0, \
      (CUlibrary *library, const void *code, int *jitOptions, void **jitOptionsValues, unsigned int numJitOptions, \
       int *libraryOptions, void **libraryOptionValues, unsigned int numLibraryOptions)) \
    X(cuLibraryLoadFromFile, cuLibraryLoadFromFile, 12000, 0, \
      (CUlibrary *library, const char *fileName, int *jitOptions, void **jitOptionsValues, unsigned int numJitOptions, \
       int *libraryOptions, void **libraryOptionValues, unsigned int numLibraryOptions)) \
    X(cuLibraryUnload, cuLibraryUnload, 12000, 0, (CUlibrary library)) \
    X(cuLibraryGetKernel, cuLibraryGetKernel, 12000, 0, (CUkernel *pKernel, CUlibrary library, const char *name)) \
    X(cuLibraryGetModule, cuLibraryGetModule, 12000, 0, (CUmodule *pMod, CUlibrary library)) \
    X(cuKernelGetFunction, cuKernelGetFunction, 12000, 0, (CUfunction *pFunc, CUkernel kernel)) \
    X(cuLibraryGetGlobal, cuLibraryGetGlobal, 12000, 0, \
      (CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name)) \
    X(cuLibraryGetManaged, cuLibraryGetManaged, 12000, 0, \
      (CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name)) \
    X(cuKernelGetAttribute, cuKernelGetAttribute, 12000, 0, (int *pi, int attrib, CUkernel kernel, int dev)) \
    X(cuKernelSetAttribute, cuKernelSetAttribute, 12000, 0, (int attrib, int val, CUkernel kernel, int dev)) \
    X(cuKernelSetCacheConfig, cuKernelSetCacheConfig, 12000, 0, (CUkernel kernel, int config, int dev)) \
    X(cuFuncGetAttribute, cuFuncGetAttribute, 2020, 0, (int *pi, int attrib, CUfunction hfunc)) \
    X(cuFuncSetAttribute, cuFuncSetAttribute, 9000, 0, (CUfunction hfunc, int attrib, int value)) \
    X(cuFuncSetCacheConfig, cuFuncSetCacheConfig, 3000, 0, (CUfunction hfunc, int config)) \
    X(cuFuncLoad, cuFuncLoad, 12040, 0, (CUfunction hfunc)) \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050, 0, \
      (int *numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize)) \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, \
      7000, 0, \
      (int *numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize, unsigned int flags)) \
    X(cuOccupancyMaxPotentialBlockSize, cuOccupancyMaxPotentialBlockSize, 6050, 0, \
      (int *minGridSize, int *blockSize, CUfunction func, size_t (*blockSizeToDynamicSMemSize)(int), \
       size_t dynamicSMemSize, int blockSizeLimit)) \
    X(cuOccupancyMaxPotentialBlockSizeWithFlags, cuOccupancyMaxPotentialBlockSizeWithFlags, 7000, 0, \
      (int *minGridSize, int *blockSize, CUfunction func, size_t (*blockSizeToDynamicSMemSize)(int), \
       size_t dynamicSMemSize, int blockSizeLimit, unsigned int flags)) \
    X(cuOccupancyAvailableDynamicSMemPerBlock, cuOccupancyAvailableDynamicSMemPerBlock, 10020, 0, \
      (size_t *dynamicSmemSize, CUfunction func, int numBlocks, int blockSize)) \
    X(cuOccupancyMaxPotentialClusterSize, cuOccupancyMaxPotentialClusterSize, 11070, 0, \
      (int *clusterSize, CUfunction func, const CUlaunchConfig *config)) \
    X(cuOccupancyMaxActiveClusters, cuOccupancyMaxActiveClusters, 11070, 0, \
      (int *numClusters, CUfunction func, const CUlaunchConfig *config)) \
    X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, 0, \
      (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)) \
    X(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000, 0, \
      (CUgraphExec *phGraphExec, CUgraph hGraph, void *instantiateParams)) \
    X(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams, 12000, 1, \
      (CUgraphExec *phGraphExec, CUgraph hGraph, void *instantiateParams)) \
    X(cuGraphExecUpdate_v2, cuGraphExecUpdate, 12000, 0, (CUgraphExec hGraphExec, CUgraph hGraph, void *resultInfo)) \
    X(cuGraphUpload, cuGraphUpload, 11010, 0, (CUgraphExec hGraphExec, CUstream hStream)) \
    X(cuGraphUpload_ptsz, cuGraphUpload, 11010, 1, (CUgraphExec hGraphExec, CUstream hStream)) \
    X(cuLinkCreate_v2, cuLinkCreate, 6050, 0, \
      (unsigned int numOptions, int *options, void **optionValues, CUlinkState *stateOut)) \
    X(cuLinkAddData_v2, cuLinkAddData, 6050, 0, \
      (CUlinkState state, int type, void *data, size_t size, const char *name, unsigned int numOptions, int *options, \
       void **optionValues)) \
    X(cuLinkAddFile_v2, cuLinkAddFile, 6050, 0, \
      (CUlinkState state, int type, const char *path, unsigned int numOptions, int *options, void **optionValues)) \
    X(cuLinkComplete, cuLinkComplete, 5050, 0, (CUlinkState state, void **cubinOut, size_t *sizeOut)) \
    X(cuLaunchKernel, cuLaunchKernel, 4000, 0, (EGPU_LAUNCH_ARGS(CUfunction), void **kernelParams, void **extra)) \
    X(cuLaunchKernel_ptsz, cuLaunchKernel, 7000, 1, (EGPU_LAUNCH_ARGS(CUfunction), void **kernelParams, void **extra)) \
    X(cuLaunchKernelEx, cuLaunchKernelEx, 11060, 0, \
      (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)) \
    X(cuLaunchKernelEx_ptsz, cuLaunchKernelEx, 11060, 1, \
      (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)) \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, 0, \
      (EGPU_LAUNCH_ARGS(CUfunction), void **kernelParams)) \
    X(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel, 9000, 1, \
      (EGPU_LAUNCH_ARGS(CUfunction), void **kernelParams)) \
    X(cuGraphAddKernelNode, cuGraphAddKernelNode, 10000, 0, \
      (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, \
       const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)) \
    X(cuGraphAddKernelNode_v2, cuGraphAddKernelNode, 12000, 0, \
      (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, \
       const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams)) \
    X(cuGraphKernelNodeSetParams, cuGraphKernelNodeSetParams, 10000, 0, \
      (CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)) \
    X(cuGraphKernelNodeSetParams_v2, cuGraphKernelNodeSetParams, 12000, 0, \
      (CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams)) \
    X(cuGraphExecKernelNodeSetParams, cuGraphExecKernelNodeSetParams, 10010, 0, \
      (CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)) \
    X(cuGraphExecKernelNodeSetParams_v2, cuGraphExecKernelNodeSetParams, 12000, 0, \
      (CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams)) \
    X(cuGraphAddNode, cuGraphAddNode, 12020, 0, \
      (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, \
       CUgraphNodeParams *nodeParams)) \
    X(cuGraphAddNode_v2, cuGraphAddNode, 12030, 0, \
      (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, \
       const CUgraphEdgeData *dependencyData, size_t numDependencies, CUgraphNodeParams *nodeParams)) \
    X(cuGraphNodeSetParams, cuGraphNodeSetParams, 12020, 0, (CUgraphNode hNode, CUgraphNodeParams *nodeParams)) \
    X(cuGraphExecNodeSetParams, cuGraphExecNodeSetParams, 12020, 0, \
      (CUgraphExec hGraphExec, CUgraphNode hNode, CUgraphNodeParams *nodeParams)) \
    X(cuGraphLaunch, cuGraphLaunch, 10000, 0, (CUgraphExec hGraphExec, CUstream hStream)) \
    X(cuGraphLaunch_ptsz, cuGraphLaunch, 10000, 1, (CUgraphExec hGraphExec, CUstream hStream)) \
    X(cuStreamBeginCapture, cuStreamBeginCapture, 10000, 0, (CUstream hStream)) \
    X(cuStreamBeginCapture_ptsz, cuStreamBeginCapture, 10000, 1, (CUstream hStream)) \
    X(cuStreamBeginCapture_v2, cuStreamBeginCapture, 10010, 0, (CUstream hStream, int mode)) \
    X(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture, 10010, 1, (CUstream hStream, int mode)) \
    X(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph, 12030, 0, \
      (CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData, \
       size_t numDependencies, int mode)) \
    X(cuStreamBeginCaptureToGraph_ptsz, cuStreamBeginCaptureToGraph, 12030, 1, \
      (CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData, \
       size_t numDependencies, int mode)) \
    X(cuStreamEndCapture, cuStreamEndCapture, 10000, 0, (CUstream hStream, CUgraph *phGraph)) \
    X(cuStreamEndCapture_ptsz, cuStreamEndCapture, 10000, 1, (CUstream hStream, CUgraph *phGraph)) \
    X(cuMemAlloc_v2, cuMemAlloc, 3020, 0, (CUdeviceptr *dptr, size_t bytesize)) \
    X(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0, \
      (CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes)) \
    X(cuMemAllocManaged, cuMemAllocManaged, 6000, 0, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags)) \
    X(cuMemAllocAsync, cuMemAllocAsync, 11020, 0, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream)) \
    X(cuMemAllocAsync_ptsz, cuMemAllocAsync, 11020, 1, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream)) \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0, \
      (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)) \
    X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 11020, 1, \
      (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)) \
    X(cuMemFree_v2, cuMemFree, 3020, 0, (CUdeviceptr dptr)) \
    X(cuMemFreeAsync, cuMemFreeAsync, 11020, 0, (CUdeviceptr dptr, CUstream hStream)) \
    X(cuMemFreeAsync_ptsz, cuMemFreeAsync, 11020, 1, (CUdeviceptr dptr, CUstream hStream)) \
    X(cuMemAllocHost_v2, cuMemAllocHost, 3020, 0, (void **pp, size_t bytesize)) \
    X(cuMemHostAlloc, cuMemHostAlloc, 2020, 0, (void **pp, size_t bytesize, unsigned int Flags)) \
    X(cuMemFreeHost, cuMemFreeHost, 2000, 0, (void *p)) \
    X(cuMemHostRegister_v2, cuMemHostRegister, 6050, 0, (void *p, size_t bytesize, unsigned int Flags)) \
    X(cuMemHostUnregister, cuMemHostUnregister, 4000, 0, (void *p)) \
    X(cuMemCreate, cuMemCreate, 10020, 0, \
      (CUmemGenericAllocationHandle *handle, size_t size, const void *prop, unsigned long long flags)) \
    X(cuMemRelease, cuMemRelease, 10020, 0, (CUmemGenericAllocationHandle handle)) \
    X(cuMemMap, cuMemMap, 10020, 0, \
      (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags)) \
    X(cuMemUnmap, cuMemUnmap, 10020, 0, (CUdeviceptr ptr, size_t size))

#endif /* EGPU_SHIM_H */
