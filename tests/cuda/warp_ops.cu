// Warp votes, match, shuffles of every kind, __nanosleep and %globaltimer.
extern "C" __global__ void warp_ops(const unsigned *in, unsigned *out) {
    unsigned v = in[threadIdx.x];
    unsigned b = __ballot_sync(0xffffffffu, v & 1);
    int a = __any_sync(0xffffffffu, v > 7) + __all_sync(0xffffffffu, v < 100);
    unsigned m = __match_any_sync(0xffffffffu, v);
    unsigned x = __shfl_xor_sync(0xffffffffu, v, 1) + __shfl_up_sync(0xffffffffu, v, 2)
               + __shfl_sync(0xffffffffu, v, 3) + __activemask();
    __nanosleep(100);
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    out[threadIdx.x] = b + a + m + x + (unsigned)t;
}
