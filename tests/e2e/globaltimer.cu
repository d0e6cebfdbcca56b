// How far %globaltimer is from CLOCK_REALTIME: the kernel reads %globaltimer between two host reads of
// CLOCK_REALTIME (before the launch, after the synchronize), N times. Prints the smallest
// globaltimer - before and after - globaltimer seen; a negative one is the clocks' skew.
#include <cstdio>
#include <ctime>

__global__ void read_timer(unsigned long long *out) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    *out = t;
}

static long long realtime_ns() {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main() {
    unsigned long long *d, g;
    cudaMalloc(&d, sizeof *d);
    read_timer<<<1, 1>>>(d);
    cudaDeviceSynchronize();
    long long lead = 1LL << 62, lag = 1LL << 62;
    for (int i = 0; i < 100; i++) {
        long long before = realtime_ns();
        read_timer<<<1, 1>>>(d);
        cudaMemcpy(&g, d, sizeof g, cudaMemcpyDeviceToHost);
        long long after = realtime_ns();
        if ((long long)g - before < lead) lead = (long long)g - before;
        if (after - (long long)g < lag) lag = after - (long long)g;
    }
    printf("globaltimer_minus_before_ns %lld after_minus_globaltimer_ns %lld\n", lead, lag);
    return 0;
}
