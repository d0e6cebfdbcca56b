// Patch functions that return at once (bench/empty_patch/tool.c): the cost of the patching mechanism alone.
#include <sanitizer_patching.h>

extern "C" __device__ __noinline__ SanitizerPatchResult EmptyEnter(void *, uint64_t) { return SANITIZER_PATCH_SUCCESS; }
extern "C" __device__ __noinline__ SanitizerPatchResult EmptyExit(void *, uint64_t) { return SANITIZER_PATCH_SUCCESS; }
extern "C" __device__ __noinline__ SanitizerPatchResult EmptyAccess(void *, uint64_t, void *, uint32_t, uint32_t,
                                                                    const void *) {
    return SANITIZER_PATCH_SUCCESS;
}
