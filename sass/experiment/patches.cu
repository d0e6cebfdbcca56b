/* Patch functions for the Compute Sanitizer patching API: counters per launch (see sass_slot.h).
 *
 * ABI (sanitizer_patching.h): extern "C" __device__ __noinline__, returning SanitizerPatchResult;
 * userdata is the device pointer the tool set for this launch (sanitizerSetLaunchCallbackData).
 * Built with `nvcc --keep-device-functions -Xptxas --compile-as-tools-patch` (run.sh).
 *
 * Counting is warp-aggregated so that cuBLAS-sized kernels stay fast: the lowest lane of each group of
 * converged threads that agree on (flags, size) adds for the whole group. __match_any_sync splits the
 * group because two call sites may reconverge inside the patch function. */
#include <sanitizer_patching.h>

#include "sass_slot.h"

static __device__ __forceinline__ unsigned lanemask_lt()
{
    unsigned m;
    asm volatile("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

/* The group's lowest lane adds per * popc(group). */
static __device__ __forceinline__ void group_add(unsigned long long* p, unsigned group, unsigned long long per)
{
    if ((group & lanemask_lt()) == 0)
        atomicAdd(p, per * (unsigned long long)__popc(group));
}

extern "C" __device__ __noinline__ SanitizerPatchResult SassBlockEnter(void* userdata, uint64_t pc)
{
    SassSlot* s = (SassSlot*)userdata;
    if (!s)
        return SANITIZER_PATCH_SUCCESS;
    unsigned g = __activemask();
    group_add(&s->enter_calls, g, 1);
    if ((g & lanemask_lt()) == 0)
        atomicAdd(&s->enter_groups, 1ULL);
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0)
        atomicAdd(&s->enter_tid0, 1ULL);
    return SANITIZER_PATCH_SUCCESS;
}

extern "C" __device__ __noinline__ SanitizerPatchResult SassBlockExit(void* userdata, uint64_t pc)
{
    SassSlot* s = (SassSlot*)userdata;
    if (!s)
        return SANITIZER_PATCH_SUCCESS;
    group_add(&s->exit_calls, __activemask(), 1);
    return SANITIZER_PATCH_SUCCESS;
}

/* Classification: READ only = load, WRITE only = store, both (or ATOMSYS) = atomic; flag_hist keeps the raw
 * combinations so that the log shows how the API really flags atomics. */
extern "C" __device__ __noinline__ SanitizerPatchResult SassGlobalAccess(
    void* userdata, uint64_t pc, void* ptr, uint32_t accessSize, uint32_t flags, const void* pData)
{
    SassSlot* s = (SassSlot*)userdata;
    if (!s)
        return SANITIZER_PATCH_SUCCESS;
    unsigned long long key = ((unsigned long long)flags << 32) | accessSize;
    unsigned g = __match_any_sync(__activemask(), key);
    bool rd = flags & SANITIZER_MEMORY_DEVICE_FLAG_READ;
    bool wr = flags & SANITIZER_MEMORY_DEVICE_FLAG_WRITE;
    bool sys = flags & SANITIZER_MEMORY_DEVICE_FLAG_ATOMSYS;
    group_add(&s->flag_hist[flags & (SASS_FLAG_HIST - 1)], g, 1);
    if ((rd && wr) || sys) {
        group_add(&s->atomics, g, 1);
        group_add(&s->atomic_bytes, g, accessSize);
    } else if (wr) {
        group_add(&s->stores, g, 1);
        group_add(&s->store_bytes, g, accessSize);
    } else if (rd) {
        group_add(&s->loads, g, 1);
        group_add(&s->load_bytes, g, accessSize);
    } else {
        group_add(&s->other, g, 1);
    }
    return SANITIZER_PATCH_SUCCESS;
}
