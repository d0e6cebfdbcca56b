// Tensor cores: wmma fragments loaded from and stored to global memory (no memory site sees those), and
// an mma.sync in inline asm between plain global loads and stores (sm_75+).
#include <mma.h>
#include <cuda_fp16.h>
using namespace nvcuda;
extern "C" __global__ void wmma_gemm(const half *a, const half *b, float *c) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
extern "C" __global__ void mma_sync_asm(const unsigned *a, const unsigned *b, float *c) {
    unsigned ra[2], rb = b[threadIdx.x];
    for (int k = 0; k < 2; k++) ra[k] = a[threadIdx.x * 2 + k];
    float d[4] = {0, 0, 0, 0};
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(ra[0]), "r"(ra[1]), "r"(rb));
    for (int k = 0; k < 4; k++) c[threadIdx.x * 4 + k] = d[k];
}
