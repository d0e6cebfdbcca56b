"""compile_probe and egpu.bpf.h: flags, errors, the header's ids, layout and constants, libbpf coexistence."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from egpu_preload.bpf import ctx, helpers
from egpu_preload.bpf.compile import clang_args, compile_probe, find_clang
from egpu_preload.bpf.decode import decode
from egpu_preload.bpf.elf import load_object
from egpu_preload.errors import EgpuError
from launcher import egpu

PROBES = Path(__file__).parent / "probes"


def _build(tmp_path: Path, source: str, name: str = "t", **kw) -> Path:
    src = tmp_path / f"{name}.bpf.c"
    src.write_text(source)
    return compile_probe(src, **kw)


def _helper_calls(obj: Path) -> list[int]:
    prog, = load_object(obj).programs
    return [i.imm for i in decode(prog.code) if i.kind == "call" and i.src == 0]


def _call(h: helpers.Helper) -> str:
    return f"bpf_{h.name}({', '.join('0' for _ in h.args)});"


ALL_HELPERS = "\n".join(['#include "egpu.bpf.h"', 'SEC("kprobe/*") int p(struct egpu_ctx *c) {'] +
                        [f"\t{_call(h)}" for h in helpers.HELPERS.values()] + ["\treturn 0;", "}"])


def test_every_helper_declared_with_its_id(tmp_path):
    assert _helper_calls(_build(tmp_path, ALL_HELPERS)) == list(helpers.HELPERS)


def test_ctx_layout_matches_ctx_py(probe_obj):
    btf = load_object(probe_obj("count")).btf
    struct_ctx = btf.find("egpu_ctx")
    assert btf.size(struct_ctx.id) == ctx.SIZE
    got = []
    for m in btf.members(struct_ctx.id):
        t = btf.resolve(m.type)
        count = t.nelems if t.kind_name == "array" else 1
        got.append(ctx.Field(m.name, m.offset, btf.size(m.type) // count, count))
    assert tuple(got) == ctx.FIELDS


CONSTANTS = """
__u64 consts[] = {BPF_ANY, BPF_NOEXIST, BPF_EXIST, BPF_F_CURRENT_CPU, EGPU_F_LOAD, EGPU_F_STORE, EGPU_F_ATOMIC,
                  EGPU_KIND_ENTRY, EGPU_KIND_EXIT, EGPU_KIND_MEM, EGPU_KIND_LAUNCH,
                  BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_PERF_EVENT_ARRAY, BPF_MAP_TYPE_PERCPU_ARRAY,
                  BPF_MAP_TYPE_LRU_HASH, BPF_MAP_TYPE_RINGBUF, BPF_MAP_TYPE_QUEUE, BPF_MAP_TYPE_STACK,
                  BPF_MAP_TYPE_BLOOM_FILTER, BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_LRU_PERCPU_HASH,
                  sizeof(struct egpu_ctx)};
SEC("kprobe/*") int p(struct egpu_ctx *c) { return consts[c->site & 15]; }
"""
EXPECTED = [helpers.BPF_ANY, helpers.BPF_NOEXIST, helpers.BPF_EXIST, helpers.BPF_F_CURRENT_CPU, ctx.FLAG_LOAD,
            ctx.FLAG_STORE, ctx.FLAG_ATOMIC, ctx.KIND_ENTRY, ctx.KIND_EXIT, ctx.KIND_MEM, ctx.KIND_LAUNCH,
            1, 2, 4, 6, 9, 27, 22, 23, 30, 5, 10, ctx.SIZE]


def _constants(obj: Path) -> list[int]:
    data, = [m.initial for m in load_object(obj).maps if m.name.endswith(".data")]
    return list(struct.unpack(f"<{len(EXPECTED)}Q", data))


def test_constants(tmp_path):
    assert _constants(_build(tmp_path, '#include "egpu.bpf.h"\n' + CONSTANTS)) == EXPECTED


def test_header_stands_alone_without_linux_headers(tmp_path):
    """Where linux/bpf.h is missing the header defines the subset egpu implements, with the same values."""
    src = tmp_path / "alone.bpf.c"
    src.write_text('#include "egpu.bpf.h"\n#ifdef _UAPI__LINUX_BPF_H__\n#error linux/bpf.h was found\n#endif\n'
                   + CONSTANTS)
    out = tmp_path / "alone.bpf.o"
    subprocess.run([find_clang(), "-nostdinc", *clang_args(src, out)], check=True, capture_output=True)
    assert _constants(out) == EXPECTED


LIBBPF_TOO = """
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8);
	__type(key, __u32);
	__type(value, __u64);
} m SEC(".maps");

SEC("kprobe/*")
int p(struct egpu_ctx *ctx)
{
	__u32 k = ctx->site;
	__u64 t = bpf_get_globaltimer();

	t ^= bpf_ktime_get_boot_ns() ^ bpf_ktime_get_coarse_ns() ^ bpf_get_numa_node_id();
	bpf_map_update_elem(&m, &k, &t, BPF_ANY);
	bpf_printk("t %llu", t);
	return 0;
}
"""


@pytest.mark.parametrize("includes", [
    ['"egpu.bpf.h"', "<bpf/bpf_helpers.h>"],
    ["<linux/bpf.h>", "<bpf/bpf_helpers.h>", '"egpu.bpf.h"'],
    ['"egpu.bpf.h"', "<linux/bpf.h>", "<bpf/bpf_helpers.h>", '"egpu.bpf.h"'],
], ids=["egpu-first", "libbpf-first", "twice"])
def test_libbpf_headers_in_either_order(tmp_path, includes):
    source = "".join(f"#include {h}\n" for h in includes) + LIBBPF_TOO
    assert _helper_calls(_build(tmp_path, source)) == [502, 125, 160, 42, 2, 6]


# What other libbpf headers (bpf_core_read.h's ___bpf_apply, ___bpf_narg) and map definitions (LIBBPF_PIN_*)
# take from bpf_helpers.h.
LIBBPF_EXTRAS = """
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} m SEC(".maps");
struct mine { __u64 kernel_id; } __attribute__((preserve_access_index));

SEC("kprobe/*")
int p(struct egpu_ctx *ctx)
{
	__u32 k = bpf_core_field_exists(((struct mine *)ctx)->kernel_id);
	__u64 one = 1;

	bpf_map_update_elem(&m, &k, &one, BPF_ANY);
	return 0;
}
"""


@pytest.mark.parametrize("includes", [
    ['"egpu.bpf.h"', "<bpf/bpf_helpers.h>", "<bpf/bpf_core_read.h>"],
    ["<linux/bpf.h>", "<bpf/bpf_helpers.h>", '"egpu.bpf.h"', "<bpf/bpf_core_read.h>"],
], ids=["egpu-first", "libbpf-first"])
def test_libbpf_headers_get_what_bpf_helpers_h_gives_them_after_egpu_bpf_h(tmp_path, includes):
    """egpu.bpf.h first makes bpf_helpers.h a no-op: it defines what libbpf's other headers use from it."""
    source = "".join(f"#include {h}\n" for h in includes) + LIBBPF_EXTRAS
    assert _helper_calls(_build(tmp_path, source)) == [2]


def test_default_output(tmp_path):
    src = tmp_path / "x.bpf.c"
    src.write_text((PROBES / "count.bpf.c").read_text())
    assert compile_probe(src) == tmp_path / "x.bpf.o"
    assert load_object(tmp_path / "x.bpf.o").programs[0].name == "count_entries"


def test_v4_instructions(tmp_path):
    """-mcpu=v4 reaches the v4 ISA (movsx here), -mcpu=v3 does not."""
    source = '#include "egpu.bpf.h"\nSEC("kprobe/*") int p(struct egpu_ctx *c) { return (long)(signed char)c->site; }\n'
    ops = {mcpu: {i.op for i in decode(load_object(_build(tmp_path, source, mcpu, mcpu=mcpu)).programs[0].code)}
           for mcpu in ("v3", "v4")}
    assert any("movsx" in op or "ldxs" in op for op in ops["v4"] - ops["v3"]), ops


@pytest.mark.parametrize("case,reason", [
    ("syntax", "clang failed"),
    ("missing", "no such probe source"),
    ("no-clang", "cannot run"),
])
def test_errors(tmp_path, case, reason):
    src = tmp_path / "bad.bpf.c"
    kw = {}
    if case == "syntax":
        src.write_text('#include "egpu.bpf.h"\nint f( {\n')
    elif case == "no-clang":
        src.write_text("int x;\n")
        kw["clang"] = str(tmp_path / "no-such-clang")
    with pytest.raises(EgpuError) as e:
        compile_probe(src, **kw)
    assert reason in e.value.reason and e.value.file == str(src)
    if case == "syntax":
        assert "bad.bpf.c:2" in e.value.detail


def test_signed_division_under_v3_names_v4(tmp_path):
    """clang's BPF back end refuses a signed division below -mcpu=v4 as "unsupported signed division, please
    convert to unsigned div/mod"; egpu says that v4 has it, and v4 builds the same source."""
    src = tmp_path / "sdiv.bpf.c"
    src.write_text('#include "egpu.bpf.h"\nSEC("kprobe/*") int p(struct egpu_ctx *c)\n'
                   '{ long s = (int)c->site; return s / -3 + s % 5; }\n')
    with pytest.raises(EgpuError) as e:
        compile_probe(src)
    assert "signed division and modulo need -mcpu=v4 (egpu compile --mcpu v4" in e.value.reason
    assert compile_probe(src, mcpu="v4").exists()


def test_bpf_printk_with_more_than_three_arguments_says_so_at_its_line(tmp_path):
    """clang's BPF back end refuses a call of more than five arguments as "i64 = Constant<6> too many
    arguments" and no more; the macro says what is wrong before that, at the call's line."""
    src = tmp_path / "four.bpf.c"
    src.write_text('#include "egpu.bpf.h"\nSEC("kprobe/*") int p(struct egpu_ctx *c)\n'
                   '{ bpf_printk("%d %d %d %d", 1, 2, 3, c->site); return 0; }\n')
    with pytest.raises(EgpuError) as e:
        compile_probe(src)
    assert "four.bpf.c:3" in e.value.detail and "bpf_printk takes at most three arguments" in e.value.detail
    src.write_text('#include "egpu.bpf.h"\nSEC("kprobe/*") int p(struct egpu_ctx *c)\n'
                   '{ bpf_printk("none"); bpf_printk("%d %d %d", 1, 2, c->site); return 0; }\n')
    assert compile_probe(src).exists()


def test_no_clang_on_path(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(EgpuError, match="no clang found"):
        find_clang()


def test_cli(tmp_path):
    src = tmp_path / "c.bpf.c"
    src.write_text((PROBES / "count.bpf.c").read_text())
    runner = CliRunner()
    ok = runner.invoke(egpu, ["compile", str(src), "-o", str(tmp_path / "out.o")])
    assert ok.exit_code == 0 and ok.stdout.strip() == str(tmp_path / "out.o")
    assert load_object(tmp_path / "out.o").programs
    src.write_text("int f( {\n")
    bad = runner.invoke(egpu, ["compile", str(src)])
    assert bad.exit_code == 1
    assert bad.stderr.splitlines()[0] == f"egpu: {src}: clang failed (exit 1)"


def test_cflags_build_a_probe_with_plain_clang(tmp_path):
    """egpu compile --cflags: the flags that make a plain clang build (README: build a probe yourself)."""
    import shlex
    r = CliRunner().invoke(egpu, ["compile", "--cflags"])
    assert r.exit_code == 0
    out = tmp_path / "plain.bpf.o"
    subprocess.run([find_clang(), *shlex.split(r.stdout), "-c", str(PROBES / "count.bpf.c"), "-o", str(out)],
                   check=True, capture_output=True)
    assert load_object(out).programs[0].name == "count_entries"


def test_cflags_take_mcpu_and_include_and_refuse_a_source(tmp_path):
    """--cflags exited before --mcpu and -I were read: `--cflags --mcpu v4` printed -mcpu=v3, and a source
    or -o given with it was ignored without a word."""
    import shlex
    r = CliRunner().invoke(egpu, ["compile", "--cflags", "--mcpu", "v4", "-I", str(tmp_path)])
    assert r.exit_code == 0, r.stderr
    flags = shlex.split(r.stdout)
    assert "-mcpu=v4" in flags and "-mcpu=v3" not in flags and flags[-2:] == ["-I", str(tmp_path)]
    r = CliRunner().invoke(egpu, ["compile", "--cflags", str(PROBES / "count.bpf.c"), "-o", str(tmp_path / "x.o")])
    assert r.exit_code == 2 and r.stdout == "" and "--cflags compiles nothing" in r.stderr, r.stderr
    assert not (tmp_path / "x.o").exists()
