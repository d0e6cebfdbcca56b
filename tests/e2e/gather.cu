// gather N: accesses whose warp records (examples/mem_trace_warp.bpf.c) take every form: perm[i], out[i]
// and a store by odd threads only (affine, the last over a partial mask, 2 bytes a lane), in[perm[i]]
// (offsets: a gather within a small range), and lanes alternating between two ends of a 4 GiB buffer
// (addresses: farther apart than an s32 offset reaches). N not a multiple of 32 leaves the last warp
// partial too. Checks every element on the host and prints a checksum of the results' bits.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    std::printf("error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); return 1; } } while (0)

static const size_t FAR = (size_t)1 << 30;  // floats: 4 GiB into the buffer

__global__ void gather(const float *in, const int *perm, const float *big, float *out, float *odd, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = in[perm[i]] + big[(i & 1) ? FAR + i : i];
    out[i] = v;
    if (i & 1) odd[i >> 1] = v;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? std::atoi(argv[1]) : 4001;
    const int block = 256;
    int grid = (n + block - 1) / block;
    float *in = (float *)std::malloc(sizeof(float) * n), *out = (float *)std::malloc(sizeof(float) * n);
    int *perm = (int *)std::malloc(sizeof(int) * n);
    for (int i = 0; i < n; i++) { in[i] = 0.25f * i; perm[i] = (int)((7LL * i) % n); }
    float *odd = (float *)std::malloc(sizeof(float) * (n / 2));
    float *din, *dbig, *dout, *dodd;
    int *dperm;
    CHECK(cudaMalloc(&din, sizeof(float) * n)); CHECK(cudaMalloc(&dperm, sizeof(int) * n));
    CHECK(cudaMalloc(&dout, sizeof(float) * n)); CHECK(cudaMalloc(&dbig, sizeof(float) * (FAR + n)));
    CHECK(cudaMemset(dbig, 0, sizeof(float) * n)); CHECK(cudaMemset(dbig + FAR, 0, sizeof(float) * n));
    CHECK(cudaMalloc(&dodd, sizeof(float) * (n / 2)));
    CHECK(cudaMemcpy(din, in, sizeof(float) * n, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dperm, perm, sizeof(int) * n, cudaMemcpyHostToDevice));
    gather<<<grid, block>>>(din, dperm, dbig, dout, dodd, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(out, dout, sizeof(float) * n, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(odd, dodd, sizeof(float) * (n / 2), cudaMemcpyDeviceToHost));
    unsigned long long checksum = 1469598103934665603ull, wrong = 0;
    for (int i = 0; i < n; i++) {
        float want = in[perm[i]];
        if (out[i] != want || ((i & 1) && odd[i >> 1] != want)) wrong++;
        unsigned int bits;
        std::memcpy(&bits, &out[i], 4);
        checksum = (checksum ^ bits) * 1099511628211ull;
    }
    std::printf("gather threads %d wrong %llu checksum %016llx\n", n, wrong, checksum);
    CHECK(cudaFree(din)); CHECK(cudaFree(dperm)); CHECK(cudaFree(dout)); CHECK(cudaFree(dbig));
    CHECK(cudaFree(dodd));
    return wrong ? 1 : 0;
}
