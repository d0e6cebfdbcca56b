// sm_90a, compiled not run: a thread-block cluster reading its peer's shared memory (mapa, barrier.cluster),
// a TMA tile load (cp.async.bulk.tensor) and a bulk copy (cp.async.bulk) completing on a cuda::barrier
// (mbarrier try_wait loops in scoped inline asm), and setmaxnreg.
#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda/barrier>
#include <cuda/ptx>
namespace cg = cooperative_groups;
namespace ptx = cuda::ptx;
#pragma nv_diag_suppress static_var_with_dynamic_init   // cuda::barrier in __shared__, as CUDA samples do
using barrier = cuda::barrier<cuda::thread_scope_block>;

extern "C" __global__ void __cluster_dims__(2, 1, 1) cluster_peer(const int *in, int *out) {
    __shared__ int buf[64];
    cg::cluster_group cluster = cg::this_cluster();
    buf[threadIdx.x] = in[blockIdx.x * 64 + threadIdx.x];
    cluster.sync();
    int *peer = cluster.map_shared_rank(buf, cluster.block_rank() ^ 1);
    out[blockIdx.x * 64 + threadIdx.x] = peer[threadIdx.x] + buf[threadIdx.x];
    cluster.sync();
}

extern "C" __global__ void tma_load(const __grid_constant__ CUtensorMap map, const int *in, int *out) {
    __shared__ alignas(128) int tile[32 * 32];
    __shared__ alignas(16) int flat[256];
    __shared__ barrier bar;
    if (threadIdx.x == 0) {
        init(&bar, blockDim.x);
        ptx::fence_proxy_async(ptx::space_shared);
    }
    __syncthreads();
    barrier::arrival_token token;
    if (threadIdx.x == 0) {
        int coords[2] = {0, (int)blockIdx.x * 32};
        ptx::cp_async_bulk_tensor(ptx::space_shared, ptx::space_global, tile, &map, coords,
                                  cuda::device::barrier_native_handle(bar));
        token = cuda::device::barrier_arrive_tx(bar, 1, sizeof(tile));
    } else {
        token = bar.arrive();
    }
    bar.wait(std::move(token));
    cuda::memcpy_async(flat, in + blockIdx.x * 256, cuda::aligned_size_t<16>(sizeof(flat)), bar);
    bar.arrive_and_wait();
    if (threadIdx.x >= 128) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    out[blockIdx.x * blockDim.x + threadIdx.x] = tile[threadIdx.x] + flat[threadIdx.x % 256];
}
