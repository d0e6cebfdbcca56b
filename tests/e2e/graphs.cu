// graphs K N: vecadd on N floats through CUDA graphs: one graph made by stream capture of two launches,
// one built with an explicit kernel node; each replayed K times. Checks every element on the host and
// prints a checksum, so runs with and without egpu can be compared; a kernel-entry counter must read
// exactly (2 + 1) * K * N.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    std::printf("error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); return 1; } } while (0)

__global__ void vecadd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] += a[i] + b[i];
}

int main(int argc, char **argv) {
    int k = argc > 1 ? std::atoi(argv[1]) : 10;
    int n = argc > 2 ? std::atoi(argv[2]) : 1 << 20;   // a multiple of 256: n threads per launch
    size_t bytes = sizeof(float) * n;
    float *a = (float *)std::malloc(bytes), *b = (float *)std::malloc(bytes), *c = (float *)std::malloc(bytes);
    for (int i = 0; i < n; i++) { a[i] = 0.25f * (i % 13); b[i] = (float)(i % 5); }
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, bytes)); CHECK(cudaMalloc(&db, bytes)); CHECK(cudaMalloc(&dc, bytes));
    CHECK(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dc, 0, bytes));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    dim3 grid(n / 256), block(256);

    cudaGraph_t captured, built;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    vecadd<<<grid, block, 0, s>>>(da, db, dc, n);
    vecadd<<<grid, block, 0, s>>>(da, db, dc, n);
    CHECK(cudaStreamEndCapture(s, &captured));

    CHECK(cudaGraphCreate(&built, 0));
    void *args[] = {&da, &db, &dc, &n};
    cudaKernelNodeParams p = {};
    p.func = (void *)vecadd;
    p.gridDim = grid;
    p.blockDim = block;
    p.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, built, nullptr, 0, &p));

    cudaGraphExec_t exec_captured, exec_built;
    CHECK(cudaGraphInstantiate(&exec_captured, captured, 0));
    CHECK(cudaGraphInstantiate(&exec_built, built, 0));
    for (int i = 0; i < k; i++) {
        CHECK(cudaGraphLaunch(exec_captured, s));
        CHECK(cudaGraphLaunch(exec_built, s));
    }
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(c, dc, bytes, cudaMemcpyDeviceToHost));
    unsigned long long checksum = 1469598103934665603ull, wrong = 0;
    for (int i = 0; i < n; i++) {
        if (c[i] != 3.0f * k * (a[i] + b[i])) wrong++;
        unsigned int bits;
        std::memcpy(&bits, &c[i], 4);
        checksum = (checksum ^ bits) * 1099511628211ull;
    }
    std::printf("graphs replays %d threads %d wrong %llu checksum %016llx\n", k, n, wrong, checksum);
    return wrong ? 1 : 0;
}
