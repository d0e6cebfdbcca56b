// uvm_oversub MIB ROUNDS: unified memory made to migrate, with a known access pattern per 2 MiB range.
//
// An H200 has 141 GB, so truly oversubscribing it would take a host with more than that: instead the
// program evicts by hand. It allocates MIB MiB with cudaMallocManaged (64 MiB at least) and writes all
// of it on the host. Each round a kernel writes one byte of every 4 KiB page of the round's ranges (the
// GPU faults, the driver migrates them host-to-device), then the host reads and writes the same pages
// (CPU faults, device-to-host migrations): as if a GPU too small for them had evicted them. The ranges
// of a round are a hot set (ranges 0-7, every round) and a scan of 16 ranges moving through the rest:
// an LRU cache of 16 ranges keeps none of the hot ones, an LFU cache keeps them
// (examples/uvm_lru.py). Checks every byte the kernels wrote and prints what was touched.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    std::printf("error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); return 1; } } while (0)

static const size_t RANGE = 2 << 20, PAGE = 4096, PAGES = RANGE / PAGE;
static const int HOT = 8, SCAN = 16;

__global__ void touch(unsigned char *base, const int *ranges, int n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * PAGES) return;
    base[(size_t)ranges[i / PAGES] * RANGE + (i % PAGES) * PAGE] += 1;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 128;
    int rounds = argc > 2 ? std::atoi(argv[2]) : 8;
    if (mib < 64) mib = 64;
    int nranges = (int)(mib * (1 << 20) / RANGE);
    unsigned char *buf;
    int *ranges;
    CHECK(cudaMallocManaged(&buf, (size_t)nranges * RANGE));
    CHECK(cudaMalloc(&ranges, sizeof(int) * (HOT + SCAN)));
    std::memset(buf, 0, (size_t)nranges * RANGE);
    std::vector<int> touched((size_t)nranges, 0);
    size_t gpu_pages = 0;
    for (int r = 0; r < rounds; r++) {
        std::vector<int> now;
        for (int h = 0; h < HOT; h++) now.push_back(h);
        for (int s = 0; s < SCAN; s++) now.push_back(HOT + (r * SCAN + s) % (nranges - HOT));
        CHECK(cudaMemcpy(ranges, now.data(), sizeof(int) * now.size(), cudaMemcpyHostToDevice));
        size_t threads = now.size() * PAGES;
        touch<<<(unsigned)((threads + 255) / 256), 256>>>(buf, ranges, (int)now.size());
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        gpu_pages += threads;
        for (int g : now) {  // the host takes the pages back: read and write each
            touched[g]++;
            for (size_t p = 0; p < PAGES; p++) buf[(size_t)g * RANGE + p * PAGE + 1] = buf[(size_t)g * RANGE + p * PAGE];
        }
    }
    size_t bad = 0;
    for (int g = 0; g < nranges; g++)
        for (size_t p = 0; p < PAGES; p++) bad += buf[(size_t)g * RANGE + p * PAGE] != (unsigned char)touched[g];
    int distinct = 0;
    for (int t : touched) distinct += t > 0;
    std::printf("uvm_oversub ranges=%d rounds=%d range_accesses=%d distinct=%d gpu_bytes=%zu bad=%zu\n", nranges,
                rounds, rounds * (HOT + SCAN), distinct, gpu_pages * PAGE, bad);
    return bad != 0;
}
