// Cooperative groups: tiled_partition reductions and a grid-wide thread_rank.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
extern "C" __global__ void cg_tile_sum(const int *in, int *out, int n) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> tile = cg::tiled_partition<32>(block);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = i < n ? in[i] : 0;
    int s = cg::reduce(tile, v, cg::plus<int>());
    if (tile.thread_rank() == 0) out[i / 32] = s;
}
extern "C" __global__ void cg_coalesced(int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i % 3 == 0 && i < n) {
        cg::coalesced_group g = cg::coalesced_threads();
        out[i] = g.thread_rank() + 100 * g.size();
    }
}
