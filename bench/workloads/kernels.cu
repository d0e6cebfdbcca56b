// The suite's nvcc workloads (bench/suite.py): `kernels WORKLOAD REPS BUDGET_S`, WORKLOAD one of
// vecadd, stencil, gemm. One warm-up repetition (module load, the driver's JIT of an instrumented
// image, first-touch), then REPS timed repetitions of the same work, fewer when BUDGET_S seconds of
// timed work are used up (at least 3). Each repetition is host time from its first launch to a
// synchronize after its last, so launch costs count and process start-up does not. Prints a line per
// repetition as it ends ("BENCH_WARMUP ms", "BENCH_REP ms": a run cut short still tells how far it got),
// then "BENCH_DONE checksum" over the output's bits, which instrumentation must not change.
//
// Built with -gencode arch=compute_90,code=[sm_90,compute_90]: the fatbin carries PTX for egpu to
// rewrite and SASS for the uninstrumented runs.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <cuda_runtime.h>

#include "../../tests/cuda/gemm_tiled.cu"  // gemm_tiled (16x16 shared-memory tiles)
#include "../../tests/cuda/stencil.cu"     // stencil3

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    std::printf("error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); std::exit(1); } } while (0)

extern "C" __global__ void vecadd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

static double now_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// One repetition's work, sized for about 50 ms on an H200 uninstrumented.
struct Work {
    float *x, *y, *z;
    void (*run)(const Work &);
    int n;
};

static void run_vecadd(const Work &w) {  // 1,000 launches over 3 x 64 MiB
    for (int i = 0; i < 1000; i++) vecadd<<<w.n / 256, 256>>>(w.x, w.y, w.z, w.n);
}

static void run_stencil(const Work &w) {  // 1,000 launches over 2 x 64 MiB (same output: any count checks)
    for (int i = 0; i < 1000; i++) stencil3<<<w.n / 256, 256>>>(w.x, w.z, w.n);
}

static void run_gemm(const Work &w) {  // 20 products of 2048 x 2048 matrices
    dim3 block(TILE, TILE), grid(w.n / TILE, w.n / TILE);
    for (int i = 0; i < 20; i++) gemm_tiled<<<grid, block>>>(w.x, w.y, w.z, w.n);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: %s vecadd|stencil|gemm REPS BUDGET_S\n", argv[0]);
        return 2;
    }
    const char *name = argv[1];
    int reps = std::atoi(argv[2]);
    double budget_ms = std::atof(argv[3]) * 1e3;
    Work w{};
    size_t elems;
    if (!std::strcmp(name, "vecadd")) {
        w.n = 1 << 24, elems = w.n, w.run = run_vecadd;
    } else if (!std::strcmp(name, "stencil")) {
        w.n = 1 << 24, elems = w.n, w.run = run_stencil;
    } else if (!std::strcmp(name, "gemm")) {
        w.n = 2048, elems = (size_t)w.n * w.n, w.run = run_gemm;
    } else {
        std::fprintf(stderr, "unknown workload %s\n", name);
        return 2;
    }
    size_t bytes = elems * sizeof(float);
    float *host = (float *)std::malloc(bytes);
    for (size_t i = 0; i < elems; i++) host[i] = (float)(i % 1000) * 1e-3f;
    CHECK(cudaMalloc(&w.x, bytes));
    CHECK(cudaMalloc(&w.y, bytes));
    CHECK(cudaMalloc(&w.z, bytes));
    CHECK(cudaMemcpy(w.x, host, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(w.y, host, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(w.z, 0, bytes));
    CHECK(cudaDeviceSynchronize());

    double t = now_ms();
    w.run(w);
    CHECK(cudaDeviceSynchronize());
    std::printf("BENCH_WARMUP %.3f\n", now_ms() - t);
    std::fflush(stdout);
    double used = 0;
    for (int r = 0; r < reps && (r < 3 || used < budget_ms); r++) {
        t = now_ms();
        w.run(w);
        CHECK(cudaDeviceSynchronize());
        double ms = now_ms() - t;
        used += ms;
        std::printf("BENCH_REP %.3f\n", ms);
        std::fflush(stdout);
    }
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(host, w.z, bytes, cudaMemcpyDeviceToHost));
    unsigned long long sum = 1469598103934665603ull;
    for (size_t i = 0; i < elems; i++) {
        unsigned int bits;
        std::memcpy(&bits, &host[i], 4);
        sum = (sum ^ bits) * 1099511628211ull;
    }
    std::printf("BENCH_DONE %016llx\n", sum);
    return 0;
}
