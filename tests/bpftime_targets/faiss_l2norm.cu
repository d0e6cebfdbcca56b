// faiss_l2norm: a stand-in for faiss' row-major L2 norm kernel (faiss/gpu/impl/L2Norm.cu), the kernel
// bpftime's faiss-test probe (tests/fixtures/bpftime/faiss-test/threadhist.bpf.c) names. faiss is not on
// the GPU machine, so this declares the little of faiss the kernel's mangled name spells out: the
// namespaces, faiss::gpu::Tensor's template parameters (T, Dim, InnerContig, IndexT = idx_t, a PtrTraits
// template) and the kernel's, so that nvcc gives it the probe's name exactly,
// _ZN5faiss3gpu14l2NormRowMajorIf6float4Li8ELb1EEEvNS0_6TensorIT0_Li2ELb1ElNS0_6traits16DefaultPtrTraitsEEENS3_IfLi1ELb1ElS6_EE
//   faiss::gpu::l2NormRowMajor<float, float4, 8, true>(Tensor<float4, 2, true, long, DefaultPtrTraits>,
//                                                      Tensor<float, 1, true, long, DefaultPtrTraits>)
// and does faiss' work: each block the squared norms of 8 rows (RowTileSize), its threads striding over
// a row's float4 columns, a warp then block reduction; launched as faiss' runL2Norm launches it (block:
// the row's float4 columns rounded up to a warp; grid: the rows over 8, rounded up). 125 rows of 256
// floats: 16 blocks of 64 threads, 1024 threads, the last block with 5 rows. Exit status 1 if a norm is wrong.
//
//   nvcc -gencode arch=compute_90,code=[sm_90,compute_90] -o faiss_l2norm faiss_l2norm.cu
//   egpu-run -p faiss-test_threadhist.bpf.o ./faiss_l2norm [LAUNCHES]     (default 10)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

namespace faiss {
using idx_t = int64_t;   // faiss/MetricType.h; `long` here, mangled `l`

namespace gpu {
namespace traits {
template <typename T>
struct DefaultPtrTraits {
    typedef T* PtrType;
};
}  // namespace traits

// faiss/gpu/utils/Tensor.cuh's parameters; of its members only the data, strides and sizes.
template <typename T, int Dim, bool InnerContig = false, typename IndexT = idx_t,
          template <typename U> class PtrTraits = traits::DefaultPtrTraits>
struct Tensor {
    typename PtrTraits<T>::PtrType data;
    IndexT stride[Dim];
    IndexT size[Dim];
};

constexpr int kWarpSize = 32;

// T: the type the sum is in; TVec: the type loaded (4 floats at once).
template <typename T, typename TVec, int RowTileSize, bool NormSquared>
__global__ void l2NormRowMajor(Tensor<TVec, 2, true> input, Tensor<float, 1, true> output) {
    extern __shared__ float smem[];   // warps x RowTileSize partial sums
    int warps = blockDim.x / kWarpSize, warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    idx_t rowStart = idx_t(blockIdx.x) * RowTileSize;
    idx_t rows = input.size[0] - rowStart < RowTileSize ? input.size[0] - rowStart : RowTileSize;
    for (idx_t r = 0; r < rows; ++r) {
        T sum = 0;
        for (idx_t col = threadIdx.x; col < input.size[1]; col += blockDim.x) {
            TVec v = input.data[(rowStart + r) * input.stride[0] + col];
            sum += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        for (int m = kWarpSize / 2; m > 0; m /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, m);
        if (lane == 0) smem[r * warps + warp] = sum;
    }
    __syncthreads();
    if (threadIdx.x < rows) {
        T sum = 0;
        for (int w = 0; w < warps; ++w) sum += smem[threadIdx.x * warps + w];
        output.data[(rowStart + threadIdx.x) * output.stride[0]] = NormSquared ? sum : sqrtf(sum);
    }
}
}  // namespace gpu
}  // namespace faiss

constexpr int ROWS = 125, DIM = 256, ROW_TILE = 8;

static void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        std::fprintf(stderr, "faiss_l2norm: %s: %s\n", what, cudaGetErrorString(e));
        std::exit(1);
    }
}

int main(int argc, char **argv) {
    using namespace faiss::gpu;
    int launches = argc > 1 ? std::atoi(argv[1]) : 10;
    static float hx[ROWS * DIM];
    float want[ROWS], got[ROWS];
    for (int i = 0; i < ROWS; i++) {
        want[i] = 0;
        for (int j = 0; j < DIM; j++) {
            hx[i * DIM + j] = ((i * 7 + j) % 13 - 6) * 0.25f;   // exact in float: the sums are too
            want[i] += hx[i * DIM + j] * hx[i * DIM + j];
        }
    }
    Tensor<float4, 2, true> in{nullptr, {DIM / 4, 1}, {ROWS, DIM / 4}};
    Tensor<float, 1, true> out{nullptr, {1}, {ROWS}};
    check(cudaMalloc(&in.data, sizeof hx), "cudaMalloc");
    check(cudaMalloc(&out.data, sizeof got), "cudaMalloc");
    check(cudaMemcpy(in.data, hx, sizeof hx, cudaMemcpyHostToDevice), "copy x");
    int threads = (DIM / 4 + kWarpSize - 1) / kWarpSize * kWarpSize;
    int blocks = (ROWS + ROW_TILE - 1) / ROW_TILE;
    size_t smem = sizeof(float) * ROW_TILE * (threads / kWarpSize);
    for (int l = 0; l < launches; l++)
        l2NormRowMajor<float, float4, ROW_TILE, true><<<blocks, threads, smem>>>(in, out);
    check(cudaGetLastError(), "launch");
    check(cudaMemcpy(got, out.data, sizeof got, cudaMemcpyDeviceToHost), "copy norms");
    double checksum = 0;
    for (int i = 0; i < ROWS; i++) {
        if (got[i] != want[i]) {
            std::fprintf(stderr, "faiss_l2norm: row %d: %g, want %g\n", i, got[i], want[i]);
            return 1;
        }
        checksum += got[i];
    }
    std::printf("faiss_l2norm: %d launches of %d blocks of %d threads, checksum=%.2f OK\n", launches, blocks,
                threads, checksum);
    return 0;
}
