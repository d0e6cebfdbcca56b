"""Kernel read/write sets: every corpus kernel (nvcc at sm_75/sm_90/fatbin, -G, -lineinfo, -rdc, Triton, CuPy,
NVRTC, numba) against hand-checked expectations, and hand-written PTX for the forms the corpus lacks (struct
parameters, pointers from memory, module globals, calls, loops)."""

from __future__ import annotations

import pytest

import ptx_corpus
from egpu_preload.cow.rwsets import analyse
from egpu_preload.translate import ptx

# numba's kernel names: Itanium-mangled module, function, ABI tags and argument types.
NUMBA = {f: next(k.name for k in ptx.parse((ptx_corpus.FIXTURES / f"numba_{f}.ptx").read_text()).kernels())
         for f in ("saxpy", "block_sum", "histogram")}

# (module stem, kernel) -> ({(param index, offset): mode}, exact). Read from the .cu sources and the
# fixtures' Python: e.g. vector_add(a, b, c, n) reads a and b, writes c.
CORPUS = {
    ("vector_add", "vector_add"): ({(0, 0): "r", (1, 0): "r", (2, 0): "w"}, True),
    ("atomics", "histogram"): ({(0, 0): "r", (1, 0): "rw", (4, 0): "rw"}, True),
    ("big_unrolled", "big_unrolled"): ({(0, 0): "r", (1, 0): "w"}, True),   # coeff is __constant__
    ("coop_groups", "cg_tile_sum"): ({(0, 0): "r", (1, 0): "w"}, True),
    ("coop_groups", "cg_coalesced"): ({(0, 0): "w"}, True),
    ("cp_async", "cp_async_copy"): ({(0, 0): "r", (1, 0): "w"}, True),
    ("device_calls", "device_calls"): ({(0, 0): "r", (1, 0): "w"}, True),   # through two .func calls
    ("early_return", "early_return"): ({(0, 0): "r", (1, 0): "w"}, True),
    ("gemm_tiled", "gemm_tiled"): ({(0, 0): "r", (1, 0): "r", (2, 0): "w"}, True),
    ("inline_asm", "inline_asm"): ({(0, 0): "r", (1, 0): "w"}, False),      # texture read, surface write
    ("predicated_store", "predicated_store"): ({(0, 0): "r", (1, 0): "w"}, True),
    ("reduction", "reduce_sum"): ({(0, 0): "r", (1, 0): "rw"}, True),       # atomicAdd on out
    ("stencil", "stencil3"): ({(0, 0): "r", (1, 0): "w"}, True),
    ("templates", "_Z5scaleIfLi1EEvPT_S0_i"): ({(0, 0): "rw"}, True),
    ("templates", "_Z5scaleIdLi2EEvPT_S0_i"): ({(0, 0): "rw"}, True),
    ("templates", "_Z5scaleIiLi1EEvPT_S0_i"): ({(0, 0): "rw"}, True),
    ("templates", "_Z5scaleIhLi3EEvPT_S0_i"): ({(0, 0): "rw"}, True),
    ("vector_loads", "add_float4"): ({(0, 0): "r", (1, 0): "r", (2, 0): "w"}, True),
    ("vector_loads", "add_half2"): ({(0, 0): "r", (1, 0): "r", (2, 0): "w"}, True),
    ("wgmma", "wgmma_m64n8k16"): ({(0, 0): "r", (1, 0): "w"}, True),        # da, db are descriptors
    ("warp_specialized", "warp_specialized"): ({(0, 0): "r", (1, 0): "w"}, True),   # setmaxnreg in both branches
    ("warp_specialized", "warp_specialized_calls"): ({(0, 0): "r", (1, 0): "w"}, True),   # setmaxnreg in .funcs
    # printf reads out[0] back; malloc'd scratch, the virtual call and ops[] make it inexact.
    ("device_runtime", "device_runtime"): ({(0, 0): "r", (1, 0): "rw"}, False),
    # (g, vg, ro, d, u, f, f4, n): atomics on g, d, u and f; __ldcv reads f back.
    ("memory_orders", "memory_orders"): ({(0, 0): "rw", (1, 0): "r", (2, 0): "r", (3, 0): "rw", (4, 0): "rw",
                                          (5, 0): "rw", (6, 0): "r"}, True),
    ("warp_ops", "warp_ops"): ({(0, 0): "r", (1, 0): "w"}, True),
    ("tma_cluster", "cluster_peer"): ({(0, 0): "r", (1, 0): "w"}, False),  # the peer block's shared memory
    ("tma_cluster", "tma_load"): ({(2, 0): "w"}, False),   # in is read by cp.async.bulk, not modelled
    # CuPy passes arrays as CArray structs (data pointer at offset 0, then sizes and strides).
    ("fixture.cupy_0", "cupy_multiply__float32_float_float32"): ({(0, 0): "r", (2, 0): "w"}, True),
    ("fixture.cupy_1", "cupy_arange__float_float_float32"): ({(2, 0): "w"}, True),
    ("fixture.cupy_2", "cupy_scale"): ({(0, 0): "r", (1, 0): "w"}, True),
    ("fixture.cupy_3", "egpu_fma"): ({(0, 0): "r", (1, 0): "r", (2, 0): "w"}, True),
    ("fixture.nvrtc_scale", "cupy_scale"): ({(0, 0): "r", (1, 0): "w"}, True),
    ("fixture.triton_add", "add_kernel"): ({(0, 0): "r", (1, 0): "r", (2, 0): "w"}, True),
    ("fixture.triton_style", "add_kernel"): ({(0, 0): "r", (1, 0): "r", (2, 0): "w"}, True),
    ("fixture.triton_matmul", "matmul_kernel"): ({(0, 0): "r", (1, 0): "r", (2, 0): "w"}, True),
    ("fixture.triton_softmax", "softmax_kernel"): ({(1, 0): "r", (0, 0): "w"}, True),  # (out, in, ...)
    # numba passes a 1-D array as 7 parameters (meminfo, parent, nitems, itemsize, data, shape, strides):
    # its data pointer is the 5th. saxpy(a, x, y, out); block_sum(x, out) adds into out atomically;
    # histogram(x, lo, hi, bins) likewise into bins.
    ("fixture.numba_saxpy", NUMBA["saxpy"]): ({(5, 0): "r", (12, 0): "r", (19, 0): "w"}, True),
    ("fixture.numba_block_sum", NUMBA["block_sum"]): ({(4, 0): "r", (11, 0): "rw"}, True),
    ("fixture.numba_histogram", NUMBA["histogram"]): ({(4, 0): "r", (13, 0): "rw"}, True),
    # -rdc=true: clamp_all<T>(x, hi, n) clamps x in place and counts into the .weak global weak_hits;
    # strong_kernel reads it.
    ("relocatable", "_Z9clamp_allIfEvPT_S0_i"): ({(0, 0): "rw"}, True),
    ("relocatable", "_Z9clamp_allIiEvPT_S0_i"): ({(0, 0): "rw"}, True),
    ("relocatable", "strong_kernel"): ({(0, 0): "rw"}, True),
    # By-value structs (param space, not global memory) and __grid_constant__ parameters read through their
    # address: only the pointer last is written.
    ("big_params", "big_param"): ({(1, 0): "w"}, True),
    ("big_params", "odd_params"): ({(6, 0): "w"}, True),
    ("big_params", "grid_const"): ({(2, 0): "w"}, True),
    ("big_params", "no_params"): ({}, True),
    ("constant_bank", "constant_bank"): ({(0, 0): "r", (1, 0): "w"}, True),   # coeff is __constant__
    # asm_clash(p, n) reads p in an asm loop and stores through a register its asm scope names `a`, which the
    # analysis does not follow: inexact.
    ("asm_clash", "asm_clash"): ({(0, 0): "rw"}, False),
    ("wmma", "wmma_gemm"): ({}, False),   # wmma.load / wmma.store: global access forms not modelled
    ("wmma", "mma_sync_asm"): ({(0, 0): "r", (1, 0): "r", (2, 0): "w"}, True),
}
# Module globals a corpus kernel reads or writes (none for the others).
GLOBALS = {("device_runtime", "device_runtime"): {"ops": "r"},
           ("relocatable", "_Z9clamp_allIfEvPT_S0_i"): {"weak_hits": "rw"},
           ("relocatable", "_Z9clamp_allIiEvPT_S0_i"): {"weak_hits": "rw"},
           ("relocatable", "strong_kernel"): {"weak_hits": "r"}}


def _modules(stem: str) -> list[str]:
    return [n for n in ptx_corpus.build() if n == stem or n.split(".")[0] == stem]


@pytest.fixture(scope="module")
def corpus_sets():
    return {name: analyse(text) for name, text in ptx_corpus.build().items()}


@pytest.mark.parametrize("stem,kernel", sorted(CORPUS))
def test_corpus_kernel_sets_match_expectations(corpus_sets, stem, kernel):
    want, exact = CORPUS[(stem, kernel)]
    names = _modules(stem)
    assert names, stem
    for name in names:   # every variant of a source gives the same sets
        rw = corpus_sets[name][kernel]
        got = {(next(i for i, p in enumerate(rw.params) if p.name == pn), off): m
               for (pn, off), m in rw.access.items()}
        assert got == want, name
        assert rw.exact == exact, (name, rw.unknown)
        assert rw.globals == GLOBALS.get((stem, kernel), {}), name


def test_every_corpus_kernel_has_expectations(corpus_sets):
    seen = {(name if name.startswith("fixture.") else name.split(".")[0], k)
            for name, sets in corpus_sets.items() for k in sets}
    assert seen == set(CORPUS)


HEAD = ".version 8.0\n.target sm_90\n.address_size 64\n"
REGS = ".reg .b64 %rd<20>;\n.reg .b32 %r<8>;\n.reg .f32 %f<4>;\n.reg .pred %p<4>;\n"


def _ptx(body: str, params: str = ".param .u64 k_p0, .param .u64 k_p1", pre: str = "") -> str:
    return f"{HEAD}{pre}.visible .entry k({params})\n{{\n{REGS}{body}\nret;\n}}\n"


STRUCT = ".param .align 8 .b8 k_s[24], .param .u64 k_p1"

# name -> (ptx, {(param, offset): mode}, {global: mode}, reason substring or None when exact)
CASES = {
    "pointer inside a struct parameter": (_ptx(
        "ld.param.u64 %rd1, [k_s+8];\nld.param.u64 %rd2, [k_s+16];\ncvta.to.global.u64 %rd3, %rd1;\n"
        "ld.global.f32 %f1, [%rd3+4];\ncvta.to.global.u64 %rd4, %rd2;\nst.global.f32 [%rd4], %f1;",
        STRUCT), {("k_s", 8): "r", ("k_s", 16): "w"}, {}, None),
    "struct fields by a vector load": (_ptx(
        "ld.param.v2.u64 {%rd1, %rd2}, [k_s];\nst.global.u32 [%rd2], %r1;\nld.global.u32 %r2, [%rd1];",
        STRUCT), {("k_s", 0): "r", ("k_s", 8): "w"}, {}, None),
    "struct read through the parameter's address": (_ptx(
        "mov.b64 %rd1, k_s;\ncvta.param.u64 %rd2, %rd1;\nadd.s64 %rd3, %rd2, 16;\nld.u64 %rd4, [%rd3];\n"
        "st.global.u32 [%rd4+8], %r1;", STRUCT), {("k_s", 16): "w"}, {}, None),
    "parameter address minus a constant": (_ptx(
        "mov.b64 %rd1, k_s;\nadd.s64 %rd2, %rd1, 16;\nsub.s64 %rd3, %rd2, 8;\nld.param.u64 %rd4, [%rd3];\n"
        "st.global.u32 [%rd4], %r1;", STRUCT), {}, {}, "loaded from memory"),   # not exact: slot unknown
    "pointer loaded from memory": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\nld.global.u64 %rd2, [%rd1];\nst.global.u32 [%rd2], %r1;"),
        {("k_p0", 0): "r"}, {}, "loaded from memory"),
    "32-bit loads are numbers, indexing stays exact": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\nld.global.u32 %r1, [%rd1];\nmul.wide.u32 %rd2, %r1, 4;\n"
        "ld.param.u64 %rd3, [k_p1];\nadd.s64 %rd4, %rd3, %rd2;\nst.global.u32 [%rd4], %r1;"),
        {("k_p0", 0): "r", ("k_p1", 0): "w"}, {}, None),
    "address from an integer": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\nshl.b64 %rd2, %rd1, 1;\nst.global.u32 [%rd2], %r1;"),
        {}, {}, "not derived from a pointer parameter"),
    "selp between two pointers": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\nld.param.u64 %rd2, [k_p1];\nsetp.eq.u32 %p1, %r1, 0;\n"
        "selp.b64 %rd3, %rd1, %rd2, %p1;\nred.global.add.u32 [%rd3], 1;"),
        {("k_p0", 0): "rw", ("k_p1", 0): "rw"}, {}, None),
    "loop-carried pointer": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\nmov.u64 %rd2, %rd1;\nL1:\nst.global.u8 [%rd2], %r1;\n"
        "add.s64 %rd2, %rd2, 1;\nsetp.lt.u64 %p1, %rd2, %rd3;\n@%p1 bra L1;"), {("k_p0", 0): "w"}, {}, None),
    "loop adding constants to a parameter address": (_ptx(
        "mov.b64 %rd1, k_s;\nL1:\nld.param.u64 %rd2, [%rd1];\nst.global.u8 [%rd2], %r1;\n"
        "add.s64 %rd1, %rd1, 8;\nbra L1;", STRUCT), {("k_s", 0): "w", ("k_s", 8): "w", ("k_s", 16): "w"},
        {}, "loaded from memory"),   # past 8 offsets the slot is unknown
    "module global, direct and through cvta": (_ptx(
        "ld.global.u32 %r1, [g_count+4];\nmov.u64 %rd1, g_table;\ncvta.global.u64 %rd2, %rd1;\n"
        "st.u32 [%rd2], %r1;", pre=".global .align 4 .b8 g_count[8];\n.visible .global .u32 g_table[4];\n"),
        {}, {"g_count": "r", "g_table": "w"}, None),
    "shared and local through generic addresses are not buffers": (_ptx(
        ".shared .align 4 .b8 sbuf[64];\n.local .align 8 .b8 __local_depot0[8];\nmov.u64 %rd1, sbuf;\n"
        "cvta.shared.u64 %rd2, %rd1;\nst.u32 [%rd2], %r1;\nmov.u64 %rd3, __local_depot0;\n"
        "cvta.local.u64 %rd4, %rd3;\nld.u32 %r2, [%rd4];"), {}, {}, None),
    "extern call": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\n{\n.param .b64 param0;\nst.param.b64 [param0], %rd1;\n"
        "call.uni ext, (param0);\n}", pre=".extern .func ext(.param .b64 ext_p);\n"), {}, {}, "call to ext"),
    "vprintf is harmless": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\n{\n.param .b64 param0;\nst.param.b64 [param0], %rd1;\n"
        ".param .b64 param1;\nst.param.b64 [param1], %rd1;\n.param .b32 retval0;\n"
        "call.uni (retval0), vprintf, (param0, param1);\n}",
        pre=".extern .func (.param .b32 r) vprintf(.param .b64 a, .param .b64 b);\n"), {}, {}, None),
    "indirect call": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\ncall.uni %rd1, (), proto;",
        pre=""), {}, {}, "indirect call"),
}

CALLEE = """.func store2(.param .b64 store2_p, .param .align 8 .b8 store2_s[16])
{
.reg .b64 %rd<4>;
.reg .b32 %r<2>;
ld.param.u64 %rd1, [store2_p];
st.global.u32 [%rd1], %r1;
ld.param.u64 %rd2, [store2_s+8];
ld.global.u32 %r1, [%rd2];
ret;
}
.func recurse(.param .b64 recurse_p)
{
.reg .b64 %rd<2>;
.param .b64 param0;
ld.param.u64 %rd1, [recurse_p];
st.param.b64 [param0], %rd1;
call.uni recurse, (param0);
ret;
}
"""
CASES |= {
    "callee with a struct argument, slots reused by two calls": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\nld.param.u64 %rd2, [k_p1];\n"
        "{\n.param .b64 param0;\nst.param.b64 [param0], %rd1;\n.param .align 8 .b8 param1[16];\n"
        "st.param.v2.b64 [param1], {%rd2, %rd2};\ncall.uni store2, (param0, param1);\n}\n"
        "{\n.param .b64 param0;\nst.param.b64 [param0], %rd2;\n.param .align 8 .b8 param1[16];\n"
        "st.param.b64 [param1+8], %rd1;\ncall.uni store2, (param0, param1);\n}", pre=CALLEE),
        {("k_p0", 0): "rw", ("k_p1", 0): "rw"}, {}, None),
    "callee argument slot not stored": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\n{\n.param .b64 param0;\nst.param.b64 [param0], %rd1;\n"
        ".param .align 8 .b8 param1[16];\ncall.uni store2, (param0, param1);\n}", pre=CALLEE),
        {("k_p0", 0): "w"}, {}, "not traced"),
    "recursion": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\n{\n.param .b64 param0;\nst.param.b64 [param0], %rd1;\n"
        "call.uni recurse, (param0);\n}", pre=CALLEE), {}, {}, "recursive call"),
    "surface store": (_ptx("ld.param.u64 %rd1, [k_p0];\nsust.b.1d.b32.trap [%rd1, {%r1}], {%r2};"),
                      {}, {}, "surface"),
    "bulk tensor copy": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\ncp.async.bulk.global.shared::cta.bulk_group [%rd1], [%r1], 64;"),
        {}, {}, "not modelled"),
    "matrix fragment stored to global": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\nld.global.u32 %r1, [%rd1];\nld.param.u64 %rd2, [k_p1];\n"
        "cvta.to.global.u64 %rd3, %rd2;\n"
        "wmma.store.d.sync.aligned.row.m16n16k16.global.f32 [%rd3], {%f1, %f1, %f1, %f1, %f1, %f1, %f1, %f1}, 16;"),
        {("k_p0", 0): "r"}, {}, "not modelled"),
    "matrix fragment stored through a generic address": (_ptx(
        "ld.param.u64 %rd1, [k_p1];\n"
        "wmma.store.d.sync.aligned.row.m16n16k16.f32 [%rd1], {%f1, %f1, %f1, %f1, %f1, %f1, %f1, %f1}, 16;"),
        {}, {}, "not modelled"),
    # (char *)__shfl_sync(~0, (uintptr_t)p, 0) + off, off a size_t parameter: the pointer's halves lose
    # their origins in shfl, so the sum's only origin is the integer.
    "pointer broadcast by shfl, plus an integer parameter": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\nld.param.u64 %rd2, [k_p1];\nmov.b64 {%r1, %r2}, %rd1;\n"
        "shfl.sync.idx.b32 %r3, %r1, 0, 31, -1;\nshfl.sync.idx.b32 %r4, %r2, 0, 31, -1;\n"
        "mov.b64 %rd3, {%r3, %r4};\nadd.s64 %rd4, %rd3, %rd2;\nst.global.u8 [%rd4], %r1;"),
        {("k_p1", 0): "w"}, {}, "halves"),
    "pointer loaded as two 32-bit halves": (_ptx(
        "ld.param.u64 %rd1, [k_p0];\nld.param.u64 %rd2, [k_p1];\nld.global.v2.u32 {%r1, %r2}, [%rd1];\n"
        "mov.b64 %rd3, {%r1, %r2};\nadd.s64 %rd4, %rd3, %rd2;\nst.global.u8 [%rd4], %r1;"),
        {("k_p0", 0): "r", ("k_p1", 0): "w"}, {}, "halves"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hand_written_forms(case):
    text, access, globals_, reason = CASES[case]
    rw = analyse(text)["k"]
    assert rw.access == access
    assert rw.globals == globals_
    if reason is None:
        assert rw.exact, rw.unknown
    else:
        assert any(reason in u for u in rw.unknown), rw.unknown
