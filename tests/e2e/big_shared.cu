// big_shared K N: a kernel whose launches ask for 64 KB of dynamic shared memory, raised on it first with
// cudaFuncSetAttribute (as kernels with large tiles do), on N floats: launched K times, then captured into a
// graph replayed K times, then launched K times more. Under egpu-run's counting the capture's flip loads an
// instrumented copy of the module, which must get the raised limit too, or every launch after the flip fails.
// Checks every element on the host; a kernel-entry counter must read exactly 3 * K * N.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    std::printf("error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); return 1; } } while (0)

constexpr int TILE = 16384;   // floats: 64 KB, past the 48 KB a launch gets unless the kernel is raised

__global__ void staged(const float *in, float *out, int n) {
    extern __shared__ float tile[];
    for (int j = threadIdx.x; j < TILE; j += blockDim.x) tile[j] = (float)(j % 97);
    __syncthreads();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] + tile[(i * 7) % TILE];
}

int main(int argc, char **argv) {
    int k = argc > 1 ? std::atoi(argv[1]) : 10;
    int n = argc > 2 ? std::atoi(argv[2]) : 1 << 20;   // a multiple of 256: n threads per launch
    size_t bytes = sizeof(float) * n, shmem = sizeof(float) * TILE;
    float *in = (float *)std::malloc(bytes), *out = (float *)std::malloc(bytes);
    for (int i = 0; i < n; i++) in[i] = (float)(i % 1000);
    float *din, *dout;
    CHECK(cudaMalloc(&din, bytes)); CHECK(cudaMalloc(&dout, bytes));
    CHECK(cudaMemcpy(din, in, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaFuncSetAttribute(staged, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shmem));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    dim3 block(256), grid(n / 256);
    for (int i = 0; i < k; i++) {
        staged<<<grid, block, shmem, s>>>(din, dout, n);
        CHECK(cudaGetLastError());
    }
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    staged<<<grid, block, shmem, s>>>(din, dout, n);
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < k; i++) CHECK(cudaGraphLaunch(exec, s));
    for (int i = 0; i < k; i++) {
        staged<<<grid, block, shmem, s>>>(din, dout, n);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(out, dout, bytes, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int i = 0; i < n; i++) wrong += out[i] != in[i] + (float)(((i * 7) % TILE) % 97);
    std::printf("big_shared launches %d threads %d wrong %d\n", 3 * k, n, wrong);
    return wrong != 0;
}
