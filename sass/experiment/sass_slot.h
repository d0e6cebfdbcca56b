/* One launch's record in device memory: the patch functions add into it, the tool reads it back once
 * the launch has finished. Shared by sass_tool.cpp (host) and the patch functions (device). */
#pragma once

#define SASS_FLAG_HIST 16  /* histogram of the low 4 bits of Sanitizer_DeviceMemoryFlags */

struct SassSlot {
    unsigned long long enter_calls;    /* block-enter callback invocations (threads? blocks? measured) */
    unsigned long long enter_groups;   /* invocations by the lowest lane of each converged group */
    unsigned long long enter_tid0;     /* invocations by threadIdx == (0,0,0): one per block */
    unsigned long long exit_calls;     /* block-exit callback invocations */
    unsigned long long loads, stores, atomics, other;
    unsigned long long load_bytes, store_bytes, atomic_bytes;
    unsigned long long probe_calls;    /* ebpf variant: calls of the egpu probe */
    unsigned long long kernel_id;      /* ebpf variant: struct egpu_ctx.kernel_id (FNV-1a 64 of the name) */
    unsigned long long launch_id;      /* ebpf variant: struct egpu_ctx.launch_id */
    unsigned long long maps[2];        /* ebpf variant: the egpu map table (map 0's region, trace ring) */
    unsigned long long flag_hist[SASS_FLAG_HIST];
    unsigned long long region[16];     /* ebpf variant: map 0's region (64-byte header, then the values) */
};
