/* kernelretsnoop: bpftime's example/gpu/kernelretsnoop, written for egpu. When does each thread of
 * vectorAdd finish, and in what order?
 *
 * At every thread's exit, a record with its block and thread index and the %globaltimer time goes to
 * a perf buffer, as in bpftime (bpf_perf_event_output; egpu tags each record with the SM that wrote
 * it, the "CPU" of a GPU perf buffer). Sorting the records by time shows which threads and blocks
 * finish late. A glob selects the kernel instead of the mangled name, so any vectorAdd overload
 * matches; records that do not fit the buffer are dropped and counted, never waited for.
 *
 *   egpu-run -p examples/kernelretsnoop.bpf.c ./vec_add
 */
#include "egpu.bpf.h"

struct data {
	__u64 block_x, block_y, block_z;
	__u64 thread_x, thread_y, thread_z;
	__u64 timestamp;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} rb SEC(".maps");

/* Not inlined, on purpose: a function taking struct data * is what makes clang describe the struct in
 * the object's BTF, which is how egpu prints the records with their field names. */
static __noinline void fill(struct data *data)
{
	bpf_get_block_idx(&data->block_x, &data->block_y, &data->block_z);
	bpf_get_thread_idx(&data->thread_x, &data->thread_y, &data->thread_z);
	data->timestamp = bpf_get_globaltimer();
}

SEC("kretprobe/vectorAdd*")
int cuda__retprobe(struct egpu_ctx *ctx)
{
	struct data data = {};

	fill(&data);
	bpf_perf_event_output(ctx, &rb, BPF_F_CURRENT_CPU, &data, sizeof(data));
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
