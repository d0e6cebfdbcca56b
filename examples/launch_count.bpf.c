/* launch_count: how often is each kernel launched, and how big are its grids?
 *
 * Runs once per launch, on the host, when the launch is enqueued: no GPU code is added, so this works
 * for every kernel, including SASS-only libraries (cuBLAS, cuDNN) whose kernels cannot be instrumented.
 *
 *   egpu-run -p examples/launch_count.bpf.c ./app
 */
#include "counters.bpf.h"

/* kernel -> launches (the key is ctx->kernel_id: egpu prints the kernel's name). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} launches SEC(".maps");

/* log2 histogram of blocks per launch (gridDim.x * gridDim.y * gridDim.z). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HIST_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} hist_grid_blocks SEC(".maps");

SEC("egpu/launch/*")
int count_launch(struct egpu_ctx *ctx)
{
	__u64 kernel = ctx->kernel_id;
	__u64 blocks = (__u64)ctx->grid[0] * ctx->grid[1] * ctx->grid[2];

	count_add(&launches, &kernel, 1);
	hist_add(&hist_grid_blocks, blocks);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
