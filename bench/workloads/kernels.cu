// The suite's nvcc workloads (bench/suite.py): `kernels WORKLOAD REPS BUDGET_S [TARGET_MS]`, WORKLOAD
// one of vecadd (16 Mi floats), stencil (16 Mi floats) and gemm (1024 x 1024, shared-memory tiles).
// The unit of work is one launch. Protocol (frameworks.py follows it too):
//   - warm-up: one unit (module load, the driver's JIT of an instrumented image, first touch);
//   - calibration: 1, 2, 4, ... units until they take 10 ms, which sizes a repetition at TARGET_MS
//     (default 100): a slow mode does fewer units per repetition, not longer repetitions;
//   - REPS repetitions, fewer once BUDGET_S seconds of them are used up (at least 3). Each is host time
//     from its first launch to a synchronize after its last, so launch costs count and process start-up
//     does not; the suite compares ms per unit.
// Prints "BENCH_WARMUP ms", then "BENCH_REP ms units" per repetition as it ends (a run cut short still
// tells how far it got), "BENCH_UNITS n" (every unit of the process: warm-up, calibration, repetitions;
// what a probe's counts are divided by), then "BENCH_DONE checksum" of the output's bits: the same in
// every mode. Last, "BENCH_SPLIT host_us kernel_us": the medians, over 32 launches on their own, of the
// host's time in the launch call and the kernel's time between events on either side of it. A mode's cost
// per launch is in one or the other: the driver's or a tool's host work, or the kernel running longer.
//
// Built with -gencode arch=compute_90,code=[sm_90,compute_90]: the fatbin carries PTX for egpu to
// rewrite and SASS for the uninstrumented runs.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <utility>
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

// One unit of work: a single launch. Repetitions are sized in units (see main).
struct Work {
    float *x, *y, *z;
    void (*run)(const Work &);
    int n;
};

static void run_vecadd(const Work &w) { vecadd<<<w.n / 256, 256>>>(w.x, w.y, w.z, w.n); }
static void run_stencil(const Work &w) { stencil3<<<w.n / 256, 256>>>(w.x, w.z, w.n); }
static void run_gemm(const Work &w) {
    dim3 block(TILE, TILE), grid(w.n / TILE, w.n / TILE);
    gemm_tiled<<<grid, block>>>(w.x, w.y, w.z, w.n);
}

// ms for `units` launches, from the first launch to the synchronize after the last
static double timed(const Work &w, long units) {
    double t = now_ms();
    for (long i = 0; i < units; i++) w.run(w);
    CHECK(cudaDeviceSynchronize());
    return now_ms() - t;
}

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) std::swap(v[j - 1], v[j]);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// BENCH_SPLIT: each launch alone (synchronized before and after), so neither number hides in a queue
static void split(const Work &w) {
    enum { N = 32 };
    double host_us[N], kernel_us[N];
    cudaEvent_t before, after;
    CHECK(cudaEventCreate(&before));
    CHECK(cudaEventCreate(&after));
    for (int i = 0; i < N; i++) {
        CHECK(cudaEventRecord(before));
        double t = now_ms();
        w.run(w);
        host_us[i] = (now_ms() - t) * 1e3;
        CHECK(cudaEventRecord(after));
        CHECK(cudaEventSynchronize(after));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, before, after));
        kernel_us[i] = ms * 1e3;
    }
    std::printf("BENCH_SPLIT %.2f %.2f\n", median(host_us, N), median(kernel_us, N));
    CHECK(cudaEventDestroy(before));
    CHECK(cudaEventDestroy(after));
}

int main(int argc, char **argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: %s vecadd|stencil|gemm REPS BUDGET_S [TARGET_MS]\n", argv[0]);
        return 2;
    }
    const char *name = argv[1];
    int reps = std::atoi(argv[2]);
    double budget_ms = std::atof(argv[3]) * 1e3, target_ms = argc > 4 ? std::atof(argv[4]) : 100.0;
    Work w{};
    size_t elems;
    if (!std::strcmp(name, "vecadd")) {
        w.n = 1 << 24, elems = w.n, w.run = run_vecadd;
    } else if (!std::strcmp(name, "stencil")) {
        w.n = 1 << 24, elems = w.n, w.run = run_stencil;
    } else if (!std::strcmp(name, "gemm")) {
        w.n = 1024, elems = (size_t)w.n * w.n, w.run = run_gemm;
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

    std::printf("BENCH_WARMUP %.3f\n", timed(w, 1));
    std::fflush(stdout);
    long total = 1, k = 1;  // calibrate: double the launches until they take 10 ms, then size a repetition at TARGET_MS
    double t = timed(w, k);
    while (t < 10.0) {
        total += k;
        t = timed(w, k *= 2);
    }
    total += k;
    long units = (long)std::ceil(target_ms / (t / k));
    if (units < 1) units = 1;
    double used = 0;
    for (int r = 0; r < reps && (r < 3 || used < budget_ms); r++) {
        double ms = timed(w, units);
        used += ms;
        total += units;
        std::printf("BENCH_REP %.3f %ld\n", ms, units);
        std::fflush(stdout);
    }
    split(w);
    total += 32;
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(host, w.z, bytes, cudaMemcpyDeviceToHost));
    unsigned long long sum = 1469598103934665603ull;
    for (size_t i = 0; i < elems; i++) {
        unsigned int bits;
        std::memcpy(&bits, &host[i], 4);
        sum = (sum ^ bits) * 1099511628211ull;
    }
    std::printf("BENCH_UNITS %ld\nBENCH_DONE %016llx\n", total, sum);
    return 0;
}
