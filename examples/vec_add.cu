// vec_add: the sample program bpftime's GPU examples trace, for cuda_counter, mem_trace, kernelretsnoop,
// threadhist and launchlate (their sections name vectorAdd(const float*, const float*, float*), mangled
// _Z9vectorAddPKfS0_Pf). Launches vectorAdd ROUNDS times and checks the sums; exit status 1 if wrong.
//
//   nvcc -arch=sm_90 -o vec_add examples/vec_add.cu     (sm_90 keeps compute_90 PTX for egpu to rewrite)
//   egpu-run -p examples/threadhist.bpf.c ./vec_add [ROUNDS]
//
// -DLENGTH_PARAM: vectorAdd(const float*, const float*, float*, int) (_Z9vectorAddPKfS0_Pfi), the kernel
// bpftime's kernel_trace and threadscheduling_dynamic_hook name. -DGRAPH: the launch is captured once
// into a CUDA graph and each round replays it, as bpftime's cudagraph example does.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

constexpr int N = 1000;          // not a multiple of the block: the last block has idle threads
constexpr int THREADS = 256;

__constant__ int n;              // as in bpftime's sample: the length lives in constant memory

#ifdef LENGTH_PARAM
__global__ void vectorAdd(const float *a, const float *b, float *c, int len) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len && i < n) c[i] = a[i] + b[i];
}
#define VECTOR_ADD_ARGS a, b, c, N
#else
__global__ void vectorAdd(const float *a, const float *b, float *c) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
#define VECTOR_ADD_ARGS a, b, c
#endif

static void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        std::fprintf(stderr, "vec_add: %s: %s\n", what, cudaGetErrorString(e));
        std::exit(1);
    }
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? std::atoi(argv[1]) : 10;
    float ha[N], hb[N], hc[N];
    for (int i = 0; i < N; i++) { ha[i] = i; hb[i] = 2 * i; }
    float *a, *b, *c;
    check(cudaMalloc(&a, sizeof ha), "cudaMalloc");
    check(cudaMalloc(&b, sizeof hb), "cudaMalloc");
    check(cudaMalloc(&c, sizeof hc), "cudaMalloc");
    check(cudaMemcpy(a, ha, sizeof ha, cudaMemcpyHostToDevice), "copy a");
    check(cudaMemcpy(b, hb, sizeof hb, cudaMemcpyHostToDevice), "copy b");
    check(cudaMemcpyToSymbol(n, &N, sizeof N), "copy n");
#ifdef GRAPH
    cudaStream_t stream;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check(cudaStreamCreate(&stream), "cudaStreamCreate");
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    vectorAdd<<<(N + THREADS - 1) / THREADS, THREADS, 0, stream>>>(VECTOR_ADD_ARGS);
    check(cudaStreamEndCapture(stream, &graph), "end capture");
    check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
#endif
    for (int r = 0; r < rounds; r++) {
        check(cudaMemset(c, 0, sizeof hc), "cudaMemset");
#ifdef GRAPH
        check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
        check(cudaStreamSynchronize(stream), "graph replay");
#else
        vectorAdd<<<(N + THREADS - 1) / THREADS, THREADS>>>(VECTOR_ADD_ARGS);
#endif
        check(cudaGetLastError(), "launch");
        check(cudaMemcpy(hc, c, sizeof hc, cudaMemcpyDeviceToHost), "copy c");
        for (int i = 0; i < N; i++) {
            if (hc[i] != 3.0f * i) {
                std::fprintf(stderr, "vec_add: round %d: c[%d] = %g, expected %g\n", r, i, hc[i], 3.0f * i);
                return 1;
            }
        }
    }
    std::printf("vec_add: %d rounds of %d elements OK\n", rounds, N);
    check(cudaFree(a), "cudaFree");
    check(cudaFree(b), "cudaFree");
    check(cudaFree(c), "cudaFree");
    return 0;
}
