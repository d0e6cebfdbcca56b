// llama_rms_norm: a stand-in for llama.cpp's RMS norm kernel (ggml/src/ggml-cuda/norm.cu), the kernel
// bpftime's llama-cpp-test probe (tests/fixtures/bpftime/llama-cpp-test/threadhist.bpf.c) names.
// llama.cpp is not on the GPU machine, so this declares rms_norm_f32 with llama.cpp's template
// parameters (block_size, do_multiply, do_add) and its 23 arguments, so that nvcc gives it the probe's
// name exactly,
//   _Z12rms_norm_f32ILi1024ELb1ELb0EEvPKfPfilllfS1_lll5uint3S3_S3_S3_S1_lllS3_S3_S3_S3_
//   rms_norm_f32<1024, true, false>(float const*, float*, int, long, long, long, float, float const*,
//                                   long, long, long, uint3 x4, float const*, long, long, long, uint3 x4)
// and does its work with do_multiply (the norm times the layer's weight, fused): one block of 1024 threads
// a row, each summing the squares of every 1024th column, a warp then block reduction, then each column
// scaled by rsqrt(mean + eps) and multiplied by its weight. As in a decode step of a model with 4096-wide
// hidden states: one row (the token), one launch a layer, LAUNCHES layers; 1024 threads a launch.
// llama.cpp passes each uint3 as fast-division constants (mp, L, d); here only the divisor d, in .z.
// Exit status 1 if a value is wrong.
//
//   nvcc -gencode arch=compute_90,code=[sm_90,compute_90] -o llama_rms_norm llama_rms_norm.cu
//   egpu-run -p llama-cpp-test_threadhist.bpf.o ./llama_rms_norm [LAUNCHES]     (default 10)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

constexpr int WARP_SIZE = 32;

static __device__ float warp_reduce_sum(float x) {
    for (int m = WARP_SIZE / 2; m > 0; m /= 2) x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
}

// The add operand (do_add) and the row, channel and sample broadcasts of mul are llama.cpp's arguments,
// kept for the name; this program multiplies one row by a weight row (mul's column broadcast only).
template <int block_size, bool do_multiply = false, bool do_add = false>
static __global__ void rms_norm_f32(const float *x, float *dst, const int ncols, const int64_t stride_row,
                                    const int64_t stride_channel, const int64_t stride_sample, const float eps,
                                    const float *mul, const int64_t mul_stride_row,
                                    const int64_t mul_stride_channel, const int64_t mul_stride_sample,
                                    const uint3 mul_ncols_packed, const uint3 mul_nrows_packed,
                                    const uint3 mul_nchannels_packed, const uint3 mul_nsamples_packed,
                                    const float *add, const int64_t add_stride_row,
                                    const int64_t add_stride_channel, const int64_t add_stride_sample,
                                    const uint3 add_ncols_packed, const uint3 add_nrows_packed,
                                    const uint3 add_nchannels_packed, const uint3 add_nsamples_packed) {
    const int row = blockIdx.x, channel = blockIdx.y, sample = blockIdx.z, tid = threadIdx.x;
    x += sample * stride_sample + channel * stride_channel + row * stride_row;
    dst += ((sample * gridDim.y + channel) * gridDim.x + row) * ncols;
    float tmp = 0.0f;
    for (int col = tid; col < ncols; col += block_size) tmp += x[col] * x[col];
    tmp = warp_reduce_sum(tmp);
    if (block_size > WARP_SIZE) {
        __shared__ float s_sum[32];
        if (tid % WARP_SIZE == 0) s_sum[tid / WARP_SIZE] = tmp;
        __syncthreads();
        tmp = warp_reduce_sum(s_sum[tid % WARP_SIZE]);
    }
    const float scale = rsqrtf(tmp / ncols + eps);
    for (int col = tid; col < ncols; col += block_size) {
        float v = scale * x[col];
        if (do_multiply) v *= mul[col % mul_ncols_packed.z];
        dst[col] = v;
    }
}

constexpr int NCOLS = 4096, BLOCK = 1024;

static void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        std::fprintf(stderr, "llama_rms_norm: %s: %s\n", what, cudaGetErrorString(e));
        std::exit(1);
    }
}

int main(int argc, char **argv) {
    int launches = argc > 1 ? std::atoi(argv[1]) : 10;
    static float hx[NCOLS], hw[NCOLS], got[NCOLS];
    for (int i = 0; i < NCOLS; i++) {
        hx[i] = (i % 9 - 4) * 0.5f;
        hw[i] = 1.0f + (i % 5) * 0.25f;
    }
    float *x, *w, *dst;
    check(cudaMalloc(&x, sizeof hx), "cudaMalloc");
    check(cudaMalloc(&w, sizeof hw), "cudaMalloc");
    check(cudaMalloc(&dst, sizeof got), "cudaMalloc");
    check(cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice), "copy x");
    check(cudaMemcpy(w, hw, sizeof hw, cudaMemcpyHostToDevice), "copy weight");
    const uint3 ncols = make_uint3(0, 0, NCOLS), one = make_uint3(0, 0, 1);
    const float eps = 1e-6f;
    for (int l = 0; l < launches; l++)
        rms_norm_f32<BLOCK, true, false><<<dim3(1, 1, 1), BLOCK>>>(x, dst, NCOLS, NCOLS, NCOLS, NCOLS, eps, w, 0, 0,
                                                                   0, ncols, one, one, one, nullptr, 0, 0, 0,
                                                                   one, one, one, one);
    check(cudaGetLastError(), "launch");
    check(cudaMemcpy(got, dst, sizeof got, cudaMemcpyDeviceToHost), "copy dst");
    double sumsq = 0, checksum = 0;
    for (int i = 0; i < NCOLS; i++) sumsq += hx[i] * hx[i];
    const double scale = 1.0 / std::sqrt(sumsq / NCOLS + eps);
    for (int i = 0; i < NCOLS; i++) {
        const double want = scale * hx[i] * hw[i];
        if (std::fabs(got[i] - want) > 1e-5 * (1 + std::fabs(want))) {
            std::fprintf(stderr, "llama_rms_norm: column %d: %g, want %g\n", i, got[i], want);
            return 1;
        }
        checksum += got[i] * got[i];
    }
    std::printf("llama_rms_norm: %d launches of 1 block of %d threads, checksum=%.4f OK\n", launches, BLOCK,
                checksum);
    return 0;
}
