// header_read.cu: how long the host takes to read or write a few bytes of a line that waiting warps poll,
// against a line nobody touches (bench/bench_header_read.py runs it).
//
// The --trace reader reads a ring's 36-byte header once a pass; in PyTorch eager's warp trace that read took
// about 2.5 ms a pass while the pass's megabytes of records took 0.2-0.35 ms (2026-12-05c). Producers made
// to wait poll ``consumed`` on that header line with ld.acquire.sys and nanosleep (translate/helpers_ptx.py
// _wait_for_room), and take credit with atomics on it. This program asks whether polling alone slows the
// copy engine's access to the line, and whether backing the polls off helps.
//
// Usage: header_read MODE ROUNDS, MODE one of idle (no kernel), poll (every warp's lane 0 polls, 256 ns
// apart, as the producers do), backoff (the pause doubles to 8 us), poll_atomics (poll plus an atom.add on
// the line each time, as producers taking credit). Prints one JSON object: each access's microseconds.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#define CHECK(x)                                                                        \
    do {                                                                                \
        cudaError_t e_ = (x);                                                           \
        if (e_ != cudaSuccess) {                                                        \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

constexpr size_t FAR_WORDS = 4096 / 8;   // a line 4 KiB past the header: another L2 slice, nobody polls it

__global__ void wait_on(unsigned long long *line, unsigned max_pause, int atomics)
{
    if (threadIdx.x % 32)
        return;
    unsigned pause = 256;
    for (;;) {
        unsigned long long seen;
        asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(seen) : "l"(line + 2) : "memory");
        if (seen == 1)   // the host's stop; it writes 0 there while it measures writes
            return;
        if (atomics)
            atomicAdd(line + 1, 1ULL);
        __nanosleep(pause);
        pause = pause < max_pause ? pause * 2 : max_pause;
    }
}

static double us_since(std::chrono::steady_clock::time_point t)
{
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
}

static void print_list(const char *name, std::vector<double> v, bool last)
{
    printf("\"%s\": [", name);
    for (size_t i = 0; i < v.size(); i++)
        printf("%s%.2f", i ? ", " : "", v[i]);
    printf("]%s", last ? "" : ", ");
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: header_read idle|poll|backoff|poll_atomics ROUNDS\n");
        return 2;
    }
    static const struct { const char *name; bool spin; unsigned max_pause; int atomics; } modes[] = {
        {"idle", false, 0, 0}, {"poll", true, 256, 0}, {"backoff", true, 8192, 0}, {"poll_atomics", true, 256, 1}};
    const char *mode = argv[1];
    int rounds = atoi(argv[2]), m = 0;
    while (m < 4 && strcmp(modes[m].name, mode))
        m++;
    if (m == 4 || rounds < 1) {
        fprintf(stderr, "header_read: unknown mode %s or rounds %s\n", mode, argv[2]);
        return 2;
    }
    bool spin = modes[m].spin;
    unsigned max_pause = modes[m].max_pause;
    int atomics = modes[m].atomics;
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    unsigned long long *dev, *host;
    CHECK(cudaMalloc(&dev, 2 * 4096));
    CHECK(cudaMemset(dev, 0, 2 * 4096));
    CHECK(cudaHostAlloc(&host, 64, cudaHostAllocDefault));
    memset(host, 0, 64);
    cudaStream_t kernel, reader;
    CHECK(cudaStreamCreateWithFlags(&kernel, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking));
    CHECK(cudaDeviceSynchronize());
    if (spin) {
        wait_on<<<2 * sms, 1024, 0, kernel>>>(dev, max_pause, atomics);   // 64 polling warps an SM
        CHECK(cudaGetLastError());
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (cudaStreamQuery(kernel) != cudaErrorNotReady) {
            fprintf(stderr, "header_read: the waiting kernel is not running\n");
            return 1;
        }
    }
    std::vector<double> read_line, read_far, write_line, write_far;
    for (int i = 0; i < rounds; i++) {
        struct { std::vector<double> *out; unsigned long long *at; bool read; } steps[] = {
            {&read_line, dev, true}, {&read_far, dev + FAR_WORDS, true},
            {&write_line, dev + 2, false}, {&write_far, dev + FAR_WORDS + 2, false}};
        for (auto &s : steps) {
            auto t = std::chrono::steady_clock::now();
            if (s.read)
                CHECK(cudaMemcpyAsync(host, s.at, 36, cudaMemcpyDeviceToHost, reader));
            else   // 0 where the warps poll: they keep waiting
                CHECK(cudaMemcpyAsync(s.at, host + 4, 8, cudaMemcpyHostToDevice, reader));
            CHECK(cudaStreamSynchronize(reader));
            s.out->push_back(us_since(t));
        }
    }
    double stop_us = 0;
    if (spin) {
        host[5] = 1;
        auto t = std::chrono::steady_clock::now();
        CHECK(cudaMemcpyAsync(dev + 2, host + 5, 8, cudaMemcpyHostToDevice, reader));
        CHECK(cudaStreamSynchronize(reader));
        CHECK(cudaStreamSynchronize(kernel));
        stop_us = us_since(t);
    }
    printf("{\"mode\": \"%s\", \"sms\": %d, \"warps_polling\": %d, \"stop_us\": %.1f, ", mode, sms,
           spin ? 2 * sms * 32 : 0, stop_us);
    print_list("read_line_us", read_line, false);
    print_list("read_far_us", read_far, false);
    print_list("write_line_us", write_line, false);
    print_list("write_far_us", write_far, true);
    printf("}\n");
    return 0;
}
