/* A Compute Sanitizer tool for the experiment: patches every module's block enter/exit and global memory
 * accesses with the functions of patches.cu (or patches_ebpf.cu) and writes one line per launch with the
 * counts, read back right after the launch (the launch is made synchronous).
 *
 * Activation (SASS_TOOL_MODE):
 *   inject  the driver loads us through CUDA_INJECTION64_PATH and calls InitializeInjection()
 *   ctor    LD_PRELOAD: subscribe in the library constructor, before main
 *   api     nothing automatic: the program (egpu's shim, here target.cu / torch_prog.py) calls
 *           sass_tool_start(), and sass_tool_patch_module() for modules loaded before that
 * Other settings: SASS_TOOL_OUT (result file), SASS_TOOL_PATCHES (patch image), SASS_TOOL_ENTER (name of
 * the block-enter patch: SassBlockEnter, or EgpuBlockEnter for the eBPF variant).
 * Every failing sanitizer call is written to the result file and stderr with its code and name. */
#include <sanitizer.h>

#include <cuda.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "sass_slot.h"

namespace {

const unsigned kSlots = 4096;  // launches in flight at once (each is synchronous, so one per thread)

struct Context {
    bool patches_loaded = false;
    bool patches_failed = false;
    SassSlot* pool = nullptr;
};

struct Launch {
    unsigned slot;
    CUcontext ctx;
    unsigned long long seq;
    std::string name;
    unsigned grid[3], block[3];
};

std::recursive_mutex mu;  // recursive: enabling a domain might deliver callbacks at once
FILE* out = nullptr;
bool started = false;
Sanitizer_SubscriberHandle subscriber;
std::map<CUcontext, Context> contexts;
std::unordered_map<uint64_t, Launch> live;  // by gridId
std::set<CUmodule> patched;
unsigned long long launches = 0, modules_seen = 0, modules_patched = 0, lazy_loaded = 0, api_errors = 0;
thread_local bool adding_patches = false;
thread_local uint64_t last_grid = 0;

const char* env(const char* name, const char* dflt)
{
    const char* v = getenv(name);
    return v && *v ? v : dflt;
}

void emit(const char* fmt, ...)
{
    if (!out)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fflush(out);
}

// Names from the docs' SanitizerResult list, in case sanitizerGetResultString itself fails.
const char* result_name(SanitizerResult r)
{
    const char* s = nullptr;
    if (sanitizerGetResultString(r, &s) == SANITIZER_SUCCESS && s)
        return s;
    switch ((int)r) {
    case 1: return "SANITIZER_ERROR_INVALID_PARAMETER";
    case 2: return "SANITIZER_ERROR_INVALID_DEVICE";
    case 3: return "SANITIZER_ERROR_INVALID_CONTEXT";
    case 4: return "SANITIZER_ERROR_INVALID_DOMAIN_ID";
    case 5: return "SANITIZER_ERROR_INVALID_CALLBACK_ID";
    case 6: return "SANITIZER_ERROR_INVALID_OPERATION";
    case 7: return "SANITIZER_ERROR_OUT_OF_MEMORY";
    case 8: return "SANITIZER_ERROR_PARAMETER_SIZE_NOT_SUFFICIENT";
    case 9: return "SANITIZER_ERROR_API_NOT_IMPLEMENTED";
    case 10: return "SANITIZER_ERROR_MAX_LIMIT_REACHED";
    case 11: return "SANITIZER_ERROR_NOT_READY";
    case 12: return "SANITIZER_ERROR_NOT_COMPATIBLE";
    case 13: return "SANITIZER_ERROR_NOT_INITIALIZED";
    case 14: return "SANITIZER_ERROR_NOT_SUPPORTED";
    default: return "SANITIZER_ERROR_UNKNOWN";
    }
}

bool ok(SanitizerResult r, const char* call, bool quiet_success = true)
{
    if (r == SANITIZER_SUCCESS) {
        if (!quiet_success)
            emit("api %s = 0 (SANITIZER_SUCCESS)\n", call);
        return true;
    }
    api_errors++;
    emit("apierr %s = %d (%s)\n", call, (int)r, result_name(r));
    fprintf(stderr, "sass_tool: %s failed: %d (%s)\n", call, (int)r, result_name(r));
    return false;
}
#define SAN(call) ok((call), #call)
#define SAN_LOUD(call) ok((call), #call, false)

unsigned long long fnv1a(const char* s)
{
    unsigned long long h = 0xCBF29CE484222325ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001B3ULL;
    return h;
}

// Caller holds mu. Loads the patch image into ctx once and allocates the slot pool there.
Context& context(CUcontext ctx)
{
    Context& c = contexts[ctx];
    if (c.patches_loaded || c.patches_failed)
        return c;
    const char* path = env("SASS_TOOL_PATCHES", "patches.fatbin");
    adding_patches = true;  // the patch module's own MODULE_LOADED (if any) must not be patched
    bool loaded = SAN_LOUD(sanitizerAddPatchesFromFile(path, ctx));
    adding_patches = false;
    if (loaded && SAN_LOUD(sanitizerAlloc(ctx, (void**)&c.pool, sizeof(SassSlot) * kSlots))) {
        c.patches_loaded = true;
        emit("context %p patches=%s pool=%p\n", (void*)ctx, path, (void*)c.pool);
    } else {
        c.patches_failed = true;
    }
    return c;
}

// Caller holds mu.
bool patch_module(CUcontext ctx, CUmodule mod)
{
    if (patched.count(mod))
        return true;
    if (!context(ctx).patches_loaded)
        return false;
    const char* enter = env("SASS_TOOL_ENTER", "SassBlockEnter");
    bool good = SAN(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_BLOCK_ENTER, mod, enter)) &&
                SAN(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_BLOCK_EXIT, mod, "SassBlockExit")) &&
                SAN(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS, mod, "SassGlobalAccess")) &&
                SAN(sanitizerPatchModule(mod));
    if (good) {
        patched.insert(mod);
        modules_patched++;
    }
    return good;
}

void module_loaded(const Sanitizer_ResourceModuleData* d)
{
    std::lock_guard<std::recursive_mutex> g(mu);
    modules_seen++;
    if (adding_patches) {
        emit("module %p ctx=%p cubin=%zu (the patch image itself: not patched)\n", (void*)d->module,
             (void*)d->context, d->cubinSize);
        return;
    }
    bool good = patch_module(d->context, d->module);
    if (modules_seen <= 50 || !good)
        emit("module %p ctx=%p cubin=%zu patched=%d\n", (void*)d->module, (void*)d->context, d->cubinSize, (int)good);
}

void launch_begin(const Sanitizer_LaunchData* ld)
{
    std::lock_guard<std::recursive_mutex> g(mu);
    Context& c = context(ld->context);
    if (!c.pool)
        return;
    Launch l;
    l.seq = launches++;
    l.slot = (unsigned)(l.seq % kSlots);
    l.ctx = ld->context;
    l.name = ld->functionName ? ld->functionName : "?";
    l.grid[0] = ld->gridDim_x, l.grid[1] = ld->gridDim_y, l.grid[2] = ld->gridDim_z;
    l.block[0] = ld->blockDim_x, l.block[1] = ld->blockDim_y, l.block[2] = ld->blockDim_z;
    SassSlot* dev = c.pool + l.slot;
    SassSlot h;
    memset(&h, 0, sizeof h);
    h.kernel_id = fnv1a(l.name.c_str());
    h.launch_id = l.seq;
    h.maps[0] = (unsigned long long)(uintptr_t)dev->region;
    // Ordered before the kernel: same stream, and the kernel is not enqueued yet at LAUNCH_BEGIN.
    SAN(sanitizerMemcpyHostToDeviceAsync(dev, &h, sizeof h, ld->hStream));
    SanitizerResult r = sanitizerSetLaunchCallbackData(ld->hLaunch, ld->function, ld->hStream, dev);
    if (r != SANITIZER_SUCCESS) {
        ok(r, "sanitizerSetLaunchCallbackData(hLaunch, function, hStream, slot)");
        SAN(sanitizerSetCallbackData(ld->function, dev));
    }
    live[ld->gridId] = l;
    last_grid = ld->gridId;
}

void launch_end(const Sanitizer_LaunchData* ld)
{
    Launch l;
    SassSlot* dev;
    {
        std::lock_guard<std::recursive_mutex> g(mu);
        auto it = live.find(ld->gridId);
        if (it == live.end())
            it = live.find(last_grid);  // in case gridId differs between BEGIN and END
        if (it == live.end())
            return;
        l = it->second;
        live.erase(it);
        dev = contexts[l.ctx].pool + l.slot;
    }
    // Outside mu: waiting for the kernel must not block other threads' callbacks.
    SassSlot h;
    memset(&h, 0, sizeof h);
    bool good = SAN(sanitizerStreamSynchronize(ld->hStream)) &&
                SAN(sanitizerMemcpyDeviceToHost(&h, dev, sizeof h, ld->hStream));
    std::lock_guard<std::recursive_mutex> g(mu);
    std::string hist;
    for (int i = 0; i < SASS_FLAG_HIST; i++)
        if (h.flag_hist[i])
            hist += (hist.empty() ? "" : ",") + std::to_string(i) + ":" + std::to_string(h.flag_hist[i]);
    emit("launch seq=%llu ok=%d grid=%u,%u,%u block=%u,%u,%u enter=%llu groups=%llu tid0=%llu exit=%llu "
         "loads=%llu stores=%llu atomics=%llu other=%llu ldbytes=%llu stbytes=%llu atbytes=%llu probe=%llu "
         "map0=%llu flags=%s name=%s\n",
         l.seq, (int)good, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], h.enter_calls,
         h.enter_groups, h.enter_tid0, h.exit_calls, h.loads, h.stores, h.atomics, h.other, h.load_bytes,
         h.store_bytes, h.atomic_bytes, h.probe_calls, h.region[8], hist.empty() ? "-" : hist.c_str(),
         l.name.c_str());
}

void SANITIZERAPI on_callback(void*, Sanitizer_CallbackDomain domain, Sanitizer_CallbackId cbid, const void* data)
{
    if (domain == SANITIZER_CB_DOMAIN_RESOURCE) {
        if (cbid == SANITIZER_CBID_RESOURCE_MODULE_LOADED)
            module_loaded((const Sanitizer_ResourceModuleData*)data);
        else if (cbid == SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_LOADED) {
            std::lock_guard<std::recursive_mutex> g(mu);
            lazy_loaded++;
        }
    } else if (domain == SANITIZER_CB_DOMAIN_LAUNCH) {
        if (cbid == SANITIZER_CBID_LAUNCH_BEGIN)
            launch_begin((const Sanitizer_LaunchData*)data);
        else if (cbid == SANITIZER_CBID_LAUNCH_END)
            launch_end((const Sanitizer_LaunchData*)data);
    }
}

void finish()
{
    std::lock_guard<std::recursive_mutex> g(mu);
    emit("summary started=%d launches=%llu modules_seen=%llu modules_patched=%llu lazy_loaded_cb=%llu "
         "api_errors=%llu\n", (int)started, launches, modules_seen, modules_patched, lazy_loaded, api_errors);
}

}  // namespace

extern "C" {

/* Subscribe and enable the resource and launch domains; idempotent. Returns 0 on success. */
__attribute__((visibility("default"))) int sass_tool_start(void)
{
    std::lock_guard<std::recursive_mutex> g(mu);
    if (started)
        return 0;
    out = fopen(env("SASS_TOOL_OUT", "sass_tool.out"), "w");
    emit("start mode=%s pid=%d\n", env("SASS_TOOL_MODE", "inject"), (int)getpid());
    if (!SAN_LOUD(sanitizerSubscribe(&subscriber, on_callback, nullptr)))
        return 1;
    if (!SAN_LOUD(sanitizerEnableDomain(1, subscriber, SANITIZER_CB_DOMAIN_RESOURCE)) ||
        !SAN_LOUD(sanitizerEnableDomain(1, subscriber, SANITIZER_CB_DOMAIN_LAUNCH)))
        return 1;
    started = true;
    atexit(finish);
    return 0;
}

/* Patch a module that was loaded before sass_tool_start (egpu's shim knows its handle). 0 on success. */
__attribute__((visibility("default"))) int sass_tool_patch_module(CUcontext ctx, CUmodule mod)
{
    std::lock_guard<std::recursive_mutex> g(mu);
    bool good = patch_module(ctx, mod);
    emit("module %p ctx=%p patched=%d (explicit)\n", (void*)mod, (void*)ctx, (int)good);
    return good ? 0 : 1;
}

/* A marker line in the result file (the PyTorch program brackets each operation with one). */
__attribute__((visibility("default"))) void sass_tool_mark(const char* what)
{
    std::lock_guard<std::recursive_mutex> g(mu);
    emit("mark %s\n", what);
}

/* CUDA_INJECTION64_PATH entry point, called by the driver during cuInit. */
__attribute__((visibility("default"))) int InitializeInjection(void)
{
    return sass_tool_start() == 0 ? 1 : 0;
}

}  // extern "C"

__attribute__((constructor)) static void sass_tool_ctor(void)
{
    if (strcmp(env("SASS_TOOL_MODE", "inject"), "ctor") == 0)
        sass_tool_start();
}
