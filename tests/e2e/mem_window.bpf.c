/* launch_window.bpf.c at every global access, adding 1 << 32 per access: swapped in for launch_window
 * on a running job (tests/test_sass_live_gpu.py), it takes that map over, so a launch id with low bits
 * and high bits set ran both probes. */
#define STEP (1ULL << 32)
#define SITE "egpu/mem/*"
#include "launch_window.bpf.c"
