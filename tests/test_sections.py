"""Section names -> Attach: every kind, both scopes, bpftime's spellings, and the refusals."""

from __future__ import annotations

import re

import pytest

from egpu_preload.bpf.program import Attach
from egpu_preload.bpf.sections import parse_section
from egpu_preload.errors import EgpuError, ElfError
from egpu_preload.runtime import uprobes

GOOD = [
    ("kprobe/_Z9vectorAddPKfS0_Pf", Attach("entry", "_Z9vectorAddPKfS0_Pf", "thread")),
    ("kprobe/*", Attach("entry", "*", "thread")),
    ("kretprobe/vec*", Attach("exit", "vec*", "thread")),
    ("kprobe.warp/vec*", Attach("entry", "vec*", "warp")),
    ("kprobe.block/*", Attach("entry", "*", "block")),
    ("kretprobe.warp/k", Attach("exit", "k", "warp")),
    ("kretprobe.block/k", Attach("exit", "k", "block")),
    ("egpu/mem/*", Attach("mem", "*", "thread")),
    ("egpu/load/gemm*", Attach("load", "gemm*", "thread")),
    ("egpu/store/gemm*", Attach("store", "gemm*", "thread")),
    ("egpu/mem.warp/*", Attach("mem", "*", "warp")),
    ("egpu/load.block/*", Attach("load", "*", "block")),
    ("egpu/store.warp/x", Attach("store", "x", "warp")),
    ("egpu/launch/*", Attach("launch", "*", "launch")),
    ("egpu/uvm/*", Attach("uvm", "*", "host")),
    ("egpu/uvm/*_page_fault", Attach("uvm", "*_page_fault", "host")),
    # host-API sections: the GLOB is a driver API's name
    ("egpu/memcpy/cuMemcpyHtoDAsync*", Attach("memcpy", "cuMemcpyHtoDAsync*", "api")),
    ("egpu/memset/*", Attach("memset", "*", "api")),
    ("egpu/alloc/cuMemAlloc*", Attach("alloc", "cuMemAlloc*", "api")),
    ("egpu/free/*", Attach("free", "*", "api")),
    ("egpu/sync/cuStreamSynchronize", Attach("sync", "cuStreamSynchronize", "api")),
    ("kprobe/void add<float>(float*, int)", Attach("entry", "void add<float>(float*, int)", "thread")),
    ("kprobe/a/b", Attach("entry", "a/b", "thread")),          # the GLOB is everything after the first /
    ("kprobe/x.warp/y", Attach("entry", "x.warp/y", "thread")),  # a scope only counts before that /
    # bpftime's spellings: its memory-access probe, and host uprobes (loaded, not attached)
    ("kprobe/__memcapture", Attach("mem", "*", "thread")),
    ("kprobe/__memcapture_x", Attach("entry", "__memcapture_x", "thread")),
    ("uprobe", Attach("uprobe", "", "host")),
    ("uretprobe", Attach("uretprobe", "", "host")),
    ("uprobe/libcuda.so:cuLaunchKernel", Attach("uprobe", "libcuda.so:cuLaunchKernel", "host")),
    ("uretprobe/./vec_add:_Z16cudaLaunchKernelIcE9cudaErrorPT_4dim3S3_PPvmP11CUstream_st",
     Attach("uretprobe", "./vec_add:_Z16cudaLaunchKernelIcE9cudaErrorPT_4dim3S3_PPvmP11CUstream_st", "host")),
    # libbpf's other uprobe spellings: a function without its binary (bpftime's sslsniff: its loader attaches
    # it) is a bare one, given its target by egpu-run --uprobe; sleepable uprobes
    ("uprobe/do_handshake", Attach("uprobe", "", "host")),
    ("uprobe.s/libc.so.6:malloc", Attach("uprobe", "libc.so.6:malloc", "host")),
    ("uretprobe.s", Attach("uretprobe", "", "host")),
]

BAD = [
    # libbpf's offset into a function, and an address: said so, not "no such function in it" at attach
    ("uprobe/libupt.so:upt_add6+0x10", "offsets into a function are not supported (a hook takes over a function "
                                       "at its entry; a jump stored inside it could cover a branch target)"),
    ("uretprobe/./app:main+4", "offsets into a function are not supported"),
    ("uprobe/./app:0x1234", "'./app:0x1234': an address is not supported: name the function"),
    ("uprobes/x:y", "unknown section"),
    ("kprobes/x", "unknown section"),
    ("egpu/memory/x", "unknown section"),
    ("egpu/launch.warp/*", "take no scope"),
    ("egpu/uvm.block/*", "egpu/uvm probes run on the host and take no scope (.block)"),
    ("egpu/uvm/", "empty kernel name pattern"),
    ("egpu/memcpy.warp/*", "egpu/memcpy probes run on the host and take no scope (.warp)"),
    ("egpu/sync/", "empty driver API name pattern"),
    ("egpu/memcpyx/*", "unknown section"),
    ("kprobe.lane/*", "unknown scope .lane"),
    ("egpu/mem.thread/*", "unknown scope .thread"),
    ("kprobe/", "empty kernel name pattern"),
    ("egpu/store.block/", "empty kernel name pattern"),
    ("kprobe.warp", "unknown section"),
    ("kprobe", "unknown section"),
    # programs Linux runs in its kernel (bpftime's opensnoop, syscount, xdp-counter) and at USDT points
    ("xdp", "a Linux kernel program (on network traffic): egpu runs probes in GPU kernels and in the CUDA "
            "process's functions (uprobe/PATH:SYMBOL), not in the Linux kernel"),
    ("tracepoint/syscalls/sys_enter_open", "a Linux kernel program (on a tracepoint)"),
    ("raw_tracepoint.w/x", "a Linux kernel program (on a tracepoint)"),
    ("fentry.s/do_sys_open", "a Linux kernel program (on a kernel function or system call)"),
    ("cgroup/connect4", "a Linux kernel program (on a cgroup)"),
    ("usdt", "USDT probes are not supported: a USDT point lies inside a function"),
    ("usdt/./app:provider:name", "put a uprobe/PATH:SYMBOL on the function instead"),
    ("uprobe.multi/x:y", "unknown section"),
    ("nginx/ngx_http_request_handler", "unknown section"),
    ("", "unknown section"),
]


@pytest.mark.parametrize("name,attach", GOOD, ids=[g[0] for g in GOOD])
def test_parse(name, attach):
    assert parse_section(name) == attach


@pytest.mark.parametrize("name,reason", BAD, ids=[b[0] or "empty" for b in BAD])
def test_refused(name, reason):
    with pytest.raises(ElfError) as e:
        parse_section(name)
    assert reason in e.value.reason
    assert e.value.section == name
    assert str(e.value).startswith(f"{name}:" if name else "")


def test_a_section_name_a_terminal_would_act_on_is_printed_escaped():
    """A section name comes from the file (UTF-8): besides C0 controls, a C1 control (U+009B is CSI, which a
    terminal acts on as ESC [ does) and a bidi override (U+202E turns the rest of the line around) are escaped
    in the one line the CLI prints (errors.py); the two were printed as they are."""
    with pytest.raises(ElfError) as e:
        parse_section("egpu/x\x9b2J\u202e\x1b[0m\u2028")
    assert str(e.value).startswith("egpu/x\\x9b2J\\u202e\\x1b[0m\\u2028: ") and str(e.value).isprintable()


@pytest.mark.parametrize("option, reason", [
    ("p=libupt.so:upt_add6+16", "--uprobe p='libupt.so:upt_add6+16': offsets into a function are not supported"),
    ("p=libupt.so:4096", "--uprobe p='libupt.so:4096': an address is not supported"),
])
def test_an_uprobe_option_with_an_offset_or_an_address_is_refused(option, reason):
    with pytest.raises(EgpuError, match=re.escape(reason)):
        uprobes.parse_option(option)
