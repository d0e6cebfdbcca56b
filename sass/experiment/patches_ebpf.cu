/* The eBPF variant: the block-enter patch builds a struct egpu_ctx and calls a probe that egpu translated
 * from tests/probes/count.bpf.c (probe_count.ptx, pasted in by `probe_ptx.py splice`). It also keeps every
 * counter of patches.cu, so the log can compare the probe's map value with the patch's own count.
 *
 * Build (run.sh): nvcc -rdc=true -ptx --keep-device-functions -> probe_ptx.py splice -> ptxas
 * --compile-as-tools-patch. -rdc lets the PTX declare the probe as .extern. */
#include "patches.cu"
#include "egpu_ctx.h"

/* The spliced probe: egpu's `.func (.param .b64 ret) f(.param .b64 ctx)` plus the map table argument. */
extern "C" __device__ unsigned long long egpu_probe_entry(struct egpu_ctx* ctx, const unsigned long long* maps);

extern "C" __device__ __noinline__ SanitizerPatchResult EgpuBlockEnter(void* userdata, uint64_t pc)
{
    SassBlockEnter(userdata, pc);
    SassSlot* s = (SassSlot*)userdata;
    if (!s)
        return SANITIZER_PATCH_SUCCESS;
    struct egpu_ctx c = {};
    c.kernel_id = s->kernel_id;
    c.launch_id = s->launch_id;
    c.kind = EGPU_KIND_ENTRY;
    c.grid[0] = gridDim.x, c.grid[1] = gridDim.y, c.grid[2] = gridDim.z;
    c.block[0] = blockDim.x, c.block[1] = blockDim.y, c.block[2] = blockDim.z;
    egpu_probe_entry(&c, s->maps);
    group_add(&s->probe_calls, __activemask(), 1);
    return SANITIZER_PATCH_SUCCESS;
}
