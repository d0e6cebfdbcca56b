// The launch-bound loop bench_shim.py times: LAUNCHES launches of an empty kernel with cudaLaunchKernel,
// in batches of BATCH (small enough that the launch queue never fills, so the host's enqueue cost is
// what is timed), each batch followed by a synchronize that is not timed. MODE events adds what a shim
// measuring durations with CUDA events would: a cuEventRecord before and after each launch, events from
// a pool made up front. Prints one JSON line: enqueue ns per launch (host time in the launch calls) and
// wall ns per launch (the whole loop, synchronizes included).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__global__ void empty() {}

static long long now_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "plain";
    long launches = argc > 2 ? atol(argv[2]) : 200000, batch = argc > 3 ? atol(argv[3]) : 256;
    int events = !strcmp(mode, "events");
    cudaEvent_t *pool = (cudaEvent_t *)calloc(2 * batch, sizeof *pool);
    if (events)
        for (long i = 0; i < 2 * batch; i++) cudaEventCreate(&pool[i]);
    void *args[] = {NULL};
    for (int i = 0; i < 1000; i++) cudaLaunchKernel((void *)empty, 1, 1, args, 0, 0);  // warm up, load
    cudaDeviceSynchronize();
    long long enqueue = 0, start = now_ns();
    for (long done = 0; done < launches; done += batch) {
        long long t0 = now_ns();
        for (long i = 0; i < batch; i++) {
            if (events) cudaEventRecord(pool[2 * i], 0);
            cudaLaunchKernel((void *)empty, 1, 1, args, 0, 0);
            if (events) cudaEventRecord(pool[2 * i + 1], 0);
        }
        enqueue += now_ns() - t0;
        cudaDeviceSynchronize();
    }
    long long wall = now_ns() - start;
    cudaError_t err = cudaGetLastError();
    long n = (launches + batch - 1) / batch * batch;
    printf("{\"mode\": \"%s\", \"launches\": %ld, \"enqueue_ns\": %.1f, \"wall_ns\": %.1f, \"error\": %d}\n", mode, n,
           (double)enqueue / n, (double)wall / n, (int)err);
    return err != cudaSuccess;
}
