/* launch_window.bpf.c adding 1 << 32 per thread: the same map, so a swap between the two keeps it. */
#define STEP (1ULL << 32)
#include "launch_window.bpf.c"
