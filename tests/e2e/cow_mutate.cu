// The live checkpoint's GPU job (tests/test_cow_gpu.py): four 1 GiB buffers mutated on two streams,
// with patterns that can be recomputed for any step.
//
// Buffer b (stream b / 2) starts as h(b, i) and step s maps every word x to A * x + C_b + s (mod 2^32),
// so after s steps it holds f(b, s, i) = M_s * h(b, i) + K_{b,s}, (M, K) composed on the host. Each step
// kernel also writes s + 1 into its stream's slot of a 16-byte counter buffer and of the __device__
// global g_steps: a snapshot then says which step each buffer is at, and its global must agree.
//
//   cow_mutate run STEPS TIMES DONE    from scratch; "ready" after READY steps; at the end each
//                                      buffer's checksum and mismatches against f(b, STEPS, .), the
//                                      per-iteration times into TIMES ("start_ns wall_ns" lines), then
//                                      waits for the file DONE (so a checkpoint can finish) unless "-"
//   cow_mutate resume STEPS TIMES -    the same allocations, one launch (egpu-run --restore puts the
//                                      snapshot back before it), then on from each stream's counter
//   cow_mutate check FILE:B:S ...      mismatches of a saved buffer against f(B, S, .)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <unistd.h>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); std::exit(3); } } while (0)

static const size_t WORDS = (1ull << 30) / 4;   // 1 GiB of u32 per buffer
static const int BUFFERS = 4, READY = 100;
static const unsigned A = 1664525u;

__device__ unsigned long long g_steps[2];

__host__ __device__ unsigned hash0(int b, size_t i) { return (unsigned)(i * 2654435761ull) ^ (0x9E3779B9u * (b + 1)) ^ 12345u; }
__host__ __device__ unsigned cb(int b) { return 1013904223u + 7919u * b; }

// (M, K) of s steps for buffer b: f = M * h + K
static void compose(int b, unsigned long long s, unsigned *m, unsigned *k) {
    unsigned mm = 1, kk = 0;
    for (unsigned long long t = 0; t < s; t++) { mm = A * mm; kk = A * kk + cb(b) + (unsigned)t; }
    *m = mm, *k = kk;
}

__global__ void init(unsigned *x, int b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = hash0(b, i);
}

__global__ void step(uint4 *x, uint4 *y, size_t n4, unsigned cx, unsigned cy, unsigned long long s,
                     unsigned long long *counters, int k) {
    unsigned dx = cx + (unsigned)s, dy = cy + (unsigned)s;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        uint4 a = x[i], c = y[i];
        a.x = A * a.x + dx; a.y = A * a.y + dx; a.z = A * a.z + dx; a.w = A * a.w + dx;
        c.x = A * c.x + dy; c.y = A * c.y + dy; c.z = A * c.z + dy; c.w = A * c.w + dy;
        x[i] = a, y[i] = c;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) counters[k] = g_steps[k] = s + 1;
}

__global__ void touch() {}

__global__ void verify(const unsigned *x, int b, size_t n, unsigned m, unsigned k, unsigned long long *bad,
                       unsigned long long *sum) {
    unsigned long long local = 0, wrong = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        wrong += x[i] != m * hash0(b, i) + k;
        local += (unsigned long long)x[i] * (i % 1021 + 1);
    }
    if (wrong) atomicAdd(bad, wrong);
    atomicAdd(sum, local);
}

static unsigned long long now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static const int GRID = 132 * 4, BLOCK = 256;

// mismatches and checksum of device buffer x against f(b, s, .)
static void check_buffer(const unsigned *x, int b, unsigned long long s, unsigned long long *bad, unsigned long long *sum) {
    unsigned m, k;
    compose(b, s, &m, &k);
    unsigned long long *d;
    CHECK(cudaMalloc(&d, 16));
    CHECK(cudaMemset(d, 0, 16));
    verify<<<GRID, BLOCK>>>(x, b, WORDS, m, k, d, d + 1);
    unsigned long long h[2];
    CHECK(cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d));
    *bad = h[0], *sum = h[1];
}

static int check_files(int argc, char **argv) {
    unsigned *x;
    CHECK(cudaMalloc(&x, WORDS * 4));
    std::vector<unsigned> host(WORDS);
    int failed = 0;
    for (int a = 2; a < argc; a++) {
        std::string arg = argv[a];
        size_t p = arg.rfind(':'), q = arg.rfind(':', p - 1);
        std::string path = arg.substr(0, q);
        int b = std::atoi(arg.substr(q + 1, p - q - 1).c_str());
        unsigned long long s = std::strtoull(arg.substr(p + 1).c_str(), nullptr, 10);
        FILE *f = std::fopen(path.c_str(), "rb");
        size_t got = f ? std::fread(host.data(), 4, WORDS, f) : 0;
        if (f) std::fclose(f);
        CHECK(cudaMemcpy(x, host.data(), WORDS * 4, cudaMemcpyHostToDevice));
        unsigned long long bad, sum;
        check_buffer(x, b, s, &bad, &sum);
        std::printf("check %s buffer %d step %llu words %zu mismatches %llu\n", path.c_str(), b, s, got, bad);
        failed |= bad != 0 || got != WORDS;
    }
    return failed;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !std::strcmp(argv[1], "check")) return check_files(argc, argv);
    if (argc != 5) return 2;
    bool resume = !std::strcmp(argv[1], "resume");
    unsigned long long steps = std::strtoull(argv[2], nullptr, 10);
    unsigned *buf[BUFFERS];
    unsigned long long *counters;
    cudaStream_t st[2];
    for (int k = 0; k < 2; k++) CHECK(cudaStreamCreateWithFlags(&st[k], cudaStreamNonBlocking));
    for (int b = 0; b < BUFFERS; b++) CHECK(cudaMalloc(&buf[b], WORDS * 4));
    CHECK(cudaMalloc(&counters, 16));
    unsigned long long start[2] = {0, 0}, g[2] = {0, 0};
    if (resume) {
        for (int i = 0; i < 2; i++) {   // the restore happens before the first launch after the allocations
            touch<<<1, 1>>>();           // (twice: in case the runtime library allocated during the first)
            CHECK(cudaDeviceSynchronize());
        }
        CHECK(cudaMemcpy(start, counters, 16, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpyFromSymbol(g, g_steps, 16));
        std::printf("resumed at %llu %llu global %llu %llu\n", start[0], start[1], g[0], g[1]);
    } else {
        CHECK(cudaMemset(counters, 0, 16));
        for (int b = 0; b < BUFFERS; b++) init<<<GRID, BLOCK>>>(buf[b], b, WORDS);
        CHECK(cudaDeviceSynchronize());
    }
    std::vector<unsigned long long> t0s, dts;
    unsigned long long first = start[0] < start[1] ? start[0] : start[1];
    for (unsigned long long s = first; s < steps; s++) {
        unsigned long long t0 = now_ns();
        for (int k = 0; k < 2; k++)
            if (s >= start[k])
                step<<<GRID, BLOCK, 0, st[k]>>>((uint4 *)buf[2 * k], (uint4 *)buf[2 * k + 1], WORDS / 4, cb(2 * k),
                                                cb(2 * k + 1), s, counters, k);
        CHECK(cudaStreamSynchronize(st[0]));
        CHECK(cudaStreamSynchronize(st[1]));
        t0s.push_back(t0);
        dts.push_back(now_ns() - t0);
        if (s == first + READY) {
            std::printf("ready\n");
            std::fflush(stdout);
        }
    }
    CHECK(cudaGetLastError());
    int failed = 0;
    for (int b = 0; b < BUFFERS; b++) {
        unsigned long long bad, sum;
        check_buffer(buf[b], b, steps, &bad, &sum);
        std::printf("final buffer %d checksum %llu mismatches %llu\n", b, sum, bad);
        failed |= bad != 0;
    }
    CHECK(cudaMemcpy(start, counters, 16, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpyFromSymbol(g, g_steps, 16));
    std::printf("final counters %llu %llu global %llu %llu\n", start[0], start[1], g[0], g[1]);
    FILE *f = std::fopen(argv[3], "w");
    for (size_t i = 0; f && i < t0s.size(); i++) std::fprintf(f, "%llu %llu\n", t0s[i], dts[i]);
    if (f) std::fclose(f);
    std::fflush(stdout);
    if (std::strcmp(argv[4], "-"))   // let a checkpoint finish writing before the process goes
        for (int i = 0; i < 12000 && access(argv[4], F_OK) != 0; i++) usleep(10000);
    return failed;
}
