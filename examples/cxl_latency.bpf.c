/* cxl_latency: how would this program run if its memory sat behind CXL.mem?
 *
 * The eGPU paper's use case: emulate far memory on today's GPU by injecting a latency delta-t into
 * global loads, and scale it with the observed bandwidth, because a CXL link adds latency per access
 * and also queues once the traffic exceeds what the link carries (as CXLMemSim does for CPUs).
 * Here each load waits delta_ns * factor, where factor = max(1, observed / link bandwidth) over the
 * last window of WINDOW_NS, kept in a .bss global and recomputed by the first load after the window
 * ends. Compare the program's run time with and without this probe.
 *
 * Settings are const volatile (.rodata): a loader may set them before loading, as libbpf skeletons do
 * (skel->rodata->delta_ns = 400); otherwise edit the defaults here. Only loads whose address lies in
 * [cxl_lo, cxl_hi) are delayed: by default all of them.
 * Caveats: %globaltimer ticks at an implementation-defined rate (PTX ISA), so small deltas round up to
 * its tick; the shared window counter is itself an atomic every load performs, which adds contention
 * of its own; the wait stops after MAX_SPINS timer reads whatever the time, so a probe always ends.
 *
 *   egpu-run -p examples/cxl_latency.bpf.c ./app
 */
#include "egpu.bpf.h"

#define WINDOW_NS 10000 /* 10 us */
#define MAX_SPINS 1000

const volatile __u64 delta_ns = 250;      /* added latency per load at or below the link bandwidth */
const volatile __u64 link_gb_per_s = 64;  /* emulated link: a PCIe 5.0 x16 CXL device, = bytes per ns */
const volatile __u64 cxl_lo = 0;
const volatile __u64 cxl_hi = ~0ULL;

/* .bss: the current bandwidth window, and the factor of the last one in percent (<= 100: the link
 * kept up; 200: twice the link's bandwidth was asked for, so each load waits twice as long). */
__u64 window_start_ns;
__u64 window_bytes;
__u64 bw_factor_pct;

SEC("egpu/load/*")
int cxl_delay(struct egpu_ctx *ctx)
{
	__u64 start = bpf_get_globaltimer();
	__u64 begin, bytes, factor, delay;

	if (ctx->addr < cxl_lo || ctx->addr >= cxl_hi)
		return 0;
	__sync_fetch_and_add(&window_bytes, ctx->size);
	begin = window_start_ns;
	/* The load that moves window_start first closes the window and sets the factor. */
	if (start - begin >= WINDOW_NS &&
	    __sync_val_compare_and_swap(&window_start_ns, begin, start) == begin) {
		bytes = __sync_lock_test_and_set(&window_bytes, 0);
		bw_factor_pct = bytes * 100 / ((start - begin) * link_gb_per_s);
	}
	factor = bw_factor_pct;
	delay = factor > 100 ? delta_ns * factor / 100 : delta_ns;
	for (int i = 0; i < MAX_SPINS; i++) {
		if (bpf_get_globaltimer() - start >= delay)
			break;
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
