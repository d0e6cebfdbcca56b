"""PTX model: byte-identical round trips on real PTX, statement parsing, signatures, headers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

import ptx_corpus
from egpu_preload.errors import PtxError
from egpu_preload.translate import ptx


@pytest.fixture(scope="module")
def corpus() -> dict[str, str]:
    return ptx_corpus.build()


def test_corpus_round_trips_and_every_body_parses(corpus):
    assert len(corpus) >= 40
    for name, text in corpus.items():
        mod = ptx.parse(text)
        assert mod.render([]) == text, name
        assert mod.kernels(), name
        for fn in mod.functions:
            if fn.body_open is not None:
                stmts = fn.statements()
                assert any(isinstance(s, ptx.Instruction) for s in stmts), (name, fn.name)
                # Statements tile the body: outside them only whitespace and comments.
                assert all(text[s.start:s.end].strip() for s in stmts)


def test_fatbin_ptx_is_the_normalized_form(corpus):
    plain, packed = corpus["vector_add.sm_90"], corpus["vector_add.sm_90.fatbin"]
    assert "\t" in plain and "\t" not in packed and "//" not in packed
    a, b = ptx.parse(plain).kernels()[0], ptx.parse(packed).kernels()[0]
    assert [s.opcode for s in a.statements() if isinstance(s, ptx.Instruction)] == \
           [s.opcode for s in b.statements() if isinstance(s, ptx.Instruction)]


def _body(body: str) -> list[ptx.Stmt]:
    mod = ptx.parse(f".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{{\n{body}\n}}\n")
    return mod.kernels()[0].statements()


def _describe(s: ptx.Stmt) -> tuple:
    if isinstance(s, ptx.Instruction):
        return ("insn", s.pred, s.opcode, s.operands, s.depth)
    if isinstance(s, ptx.Label):
        return ("label", s.name)
    if isinstance(s, ptx.Directive):
        return ("dir", s.name)
    return (type(s).__name__.lower(), s.depth)


@pytest.mark.parametrize("body, expected", [
    ("ld.global.f32 \t%f1, [%rd8];", [("insn", None, "ld.global.f32", ("%f1", "[%rd8]"), 1)]),
    ("@%p1 bra \t$L__BB0_2;", [("insn", "%p1", "bra", ("$L__BB0_2",), 1)]),
    ("@!%p2 st.global.u32 [%rd1+-4], %r1;",
     [("insn", "!%p2", "st.global.u32", ("[%rd1+-4]", "%r1"), 1)]),
    ("ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd4+16];",
     [("insn", None, "ld.global.v4.f32", ("{%f1, %f2, %f3, %f4}", "[%rd4+16]"), 1)]),
    ("tex.1d.v4.f32.s32 {%f2, %f3, %f4, %f5}, [%rd6, {%r2}];",
     [("insn", None, "tex.1d.v4.f32.s32", ("{%f2, %f3, %f4, %f5}", "[%rd6, {%r2}]"), 1)]),
    ("$L__BB0_1:\n\tret;", [("label", "$L__BB0_1"), ("insn", None, "ret", (), 1)]),
    ("{\n.reg .pred p;\n@p ld.global.nc.f32 %f6, [%rd4];\n}",
     [("open", 2), ("dir", ".reg"), ("insn", "p", "ld.global.nc.f32", ("%f6", "[%rd4]"), 2), ("close", 2)]),
    ("{ // callseq 0, 0\n.param .b64 param0;\ncall.uni (retval0), \n_Z3fooi, \n(\nparam0\n);\n} // callseq 0",
     [("open", 2), ("dir", ".param"), ("insn", None, "call.uni", ("(retval0)", "_Z3fooi", "(\nparam0\n)"), 2),
      ("close", 2)]),
    ("prototype_0 : .callprototype ()_ (.param .b64 _);",
     [("label", "prototype_0"), ("dir", ".callprototype")]),
    ('.loc\t1 5 1\n.pragma "nounroll";\nexit;', [("dir", ".loc"), ("dir", ".pragma"), ("insn", None, "exit", (), 1)]),
    ("/* block */ mov.u32 %r1, %laneid; // tail", [("insn", None, "mov.u32", ("%r1", "%laneid"), 1)]),
    ("mov.b64 %rd1, {%r1, %r2};", [("insn", None, "mov.b64", ("%rd1", "{%r1, %r2}"), 1)]),
    ("cp.async.cg.shared.global [%r1], [%rd2], 16;",
     [("insn", None, "cp.async.cg.shared.global", ("[%r1]", "[%rd2]", "16"), 1)]),
    ("wgmma.fence.sync.aligned;", [("insn", None, "wgmma.fence.sync.aligned", (), 1)]),
    ("ld.shared::cta.u32 %r1, [%r2];", [("insn", None, "ld.shared::cta.u32", ("%r1", "[%r2]"), 1)]),
    # Found by the PTX sweep: comments are white space inside an instruction too (section 4.2), which
    # ptxas takes and the parser refused; the operands leave them out.
    ("ld.global.f32 %f1, /* [%rd9] */ [%rd1];", [("insn", None, "ld.global.f32", ("%f1", "[%rd1]"), 1)]),
    ("st.global.f32 [%rd1], // the value; a ; here\n %f1;", [("insn", None, "st.global.f32", ("[%rd1]", "%f1"), 1)]),
    ("@%p1 /* c */ ld.global/**/.f32 %f1, [%rd1];", [("insn", "%p1", "ld.global.f32", ("%f1", "[%rd1]"), 1)]),
    ('.pragma "a // b"; ret;', [("dir", ".pragma"), ("insn", None, "ret", (), 1)]),
    # ... and so is white space between a guard's parts or before an opcode's modifiers.
    ("@ %p1 bra $L;\n@! %p2 ret;", [("insn", "%p1", "bra", ("$L",), 1), ("insn", "!%p2", "ret", (), 1)]),
    ("ld .global .f32 %f1, [%rd1];", [("insn", None, "ld.global.f32", ("%f1", "[%rd1]"), 1)]),
])
def test_statements(body, expected):
    assert [_describe(s) for s in _body(body)] == expected


@pytest.mark.parametrize("body", ["{ ret;", "ret; }", "ld.global.f32 %f1, [%rd1]", "ret; @"])
def test_malformed_body_is_a_ptx_error(body):
    with pytest.raises(PtxError):
        _body(body)


@pytest.mark.parametrize("header, params", [
    (".visible .entry k(\n\t.param .u64 k_0,\n\t.param .u32 k_1\n)",
     [("k_0", "u64", 8, 8), ("k_1", "u32", 4, 4)]),
    (".entry k()", []),
    (".visible .entry t(.param .u64 .ptr .global .align 1 t_0, .param .f32 t_1)",
     [("t_0", "u64", 8, 8), ("t_1", "f32", 4, 4)]),
    (".entry s(.param .align 8 .b8 s_0[24], .param .b16 s_1)", [("s_0", "b8", 24, 8), ("s_1", "b16", 2, 2)]),
    (".weak .entry w(.param .u64 w_0 /* ptr */)", [("w_0", "u64", 8, 8)]),
    # Found by the PTX zoo: a comment after the linkage hid the kernel, and one holding ')' cut the parameter
    # list short (the launch id went into the comment); ptxas reads both as white space.
    (".visible /* a */ .entry // b\n c /* ( */ (.param .u64 c_0, // )\n.param .u32 c_1 /* ) */\n)",
     [("c_0", "u64", 8, 8), ("c_1", "u32", 4, 4)]),
])
def test_kernel_signatures(header, params):
    mod = ptx.parse(f".version 8.0\n.target sm_90\n.address_size 64\n{header}\n.maxntid 128, 1, 1\n{{\nret;\n}}\n")
    k = mod.kernels()[0]
    assert [(p.name, p.type, p.size, p.align) for p in k.params] == params
    assert mod.text[k.params_end] == ")"


def test_top_level_items():
    text = """//
.version 7.8
.target sm_80, debug
.address_size 64
.file 1 "/tmp/a.cu"
.extern .func (.param .b32 func_retval0) vprintf(.param .b64 vprintf_param_0, .param .b64 vprintf_param_1);
.global .align 4 .b8 table[8] = {1, 2, 3, 4, 5, 6, 7, 8};
.extern .shared .align 16 .b8 smem[];
.weak .func helper() { ret; }
.visible .entry k() { exit; }
.section .debug_str { $L__info_string0: .b8 107 0 }
"""
    mod = ptx.parse(text)
    assert mod.render([]) == text
    assert (mod.version, mod.target) == ((7, 8), "sm_80")
    assert text[slice(*mod.version_span)] == "7.8" and text[slice(*mod.target_span)] == "sm_80"
    assert text[:mod.header_end].endswith(".address_size 64")
    assert [(f.name, f.kind, f.body_open is not None, f.linkage) for f in mod.functions] == [
        ("vprintf", "func", False, (".extern",)), ("helper", "func", True, (".weak",)),
        ("k", "entry", True, (".visible",))]
    assert [k.name for k in mod.kernels()] == ["k"]
    assert mod.declared() == {"vprintf", "table", "smem", "helper", "k"}


def test_edits_apply_in_order_and_refuse_overlap():
    mod = ptx.parse(".version 8.0\n.target sm_90\n.entry k() { ret; }\n")
    k = mod.kernels()[0]
    ret = k.statements()[0]
    out = mod.render([ptx.Edit(ret.end, ret.end, " // after"), ptx.Edit(ret.start, ret.start, "exit; ")])
    assert out == ".version 8.0\n.target sm_90\n.entry k() { exit; ret; // after }\n"
    with pytest.raises(PtxError):
        mod.render([ptx.Edit(0, 5, ""), ptx.Edit(3, 4, "")])


@pytest.mark.parametrize("text, expected", [
    ("%r1, [%rd2+4], {%f1, %f2}", ["%r1", "[%rd2+4]", "{%f1, %f2}"]),
    ("(retval0), f, (p0, p1)", ["(retval0)", "f", "(p0, p1)"]),
    ("", []),
])
def test_split_operands(text, expected):
    assert ptx.split_operands(text) == expected


_SNIPPETS = ["ld.global.f32 %f1, [%rd1];", "@%p1 bra $L__BB0_1;", "$L__BB0_1:", ".reg .b32 %r<4>;",
             "{", "}", "st.global.v2.f32 [%rd2+8], {%f1, %f2};", "// comment", "/* c */",
             ".loc 1 2 3", "ret;", 'call.uni (retval0), f, (param0);']
_GAPS = ["\n", "\n\t", " ", "\n\n", "\t\n  "]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_SNIPPETS), st.sampled_from(_GAPS)), max_size=30))
def test_any_layout_round_trips(pieces):
    # Balance the braces the draw produced so the body is valid; count the statements it holds.
    body, depth, count = [], 0, 1   # 1: the final ret
    for snippet, gap in pieces:
        if snippet == "}" and depth == 0:
            continue
        depth += {"{": 1, "}": -1}.get(snippet, 0)
        count += not snippet.startswith(("//", "/*"))
        body.append(snippet + (gap if not snippet.startswith(("//", ".loc")) else "\n"))
    body += ["}\n"] * depth
    text = ".version 8.0\n.target sm_90\n.entry k()\n{\n" + "".join(body) + "ret;\n}\n"
    mod = ptx.parse(text)
    assert mod.render([]) == text
    assert len(mod.kernels()[0].statements()) == count + depth


def test_a_bad_statement_after_a_long_run_of_blanks_fails_at_once_on_its_own_line():
    """The blank skip is atomic: a bad statement after 4096 blanks and a comment is refused without trying
    every split of the run (exponential before), and the error names the statement's line."""
    text = (".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n/* a\n b */"
            + " " * 4096 + "bogus\"\n}\n")
    with pytest.raises(PtxError, match=r"line 7: cannot parse 'bogus"):
        ptx.parse(text).kernels()[0].statements()


def test_a_word_that_only_starts_like_a_header_directive_is_no_header():
    """Found by mutating PTX: '.versionX' raised AttributeError out of the parser once header directives were read
    across lines; ptxas refuses it, and the module's real header is still read."""
    mod = ptx.parse(".versionX 9.0\n.version 8.0\n.target sm_90\n.entry k() { ret; }\n")
    assert (mod.version, mod.target, [k.name for k in mod.kernels()]) == ((8, 0), "sm_90", ["k"])


@pytest.mark.parametrize("version", ["8.k4", "x", ".5", "8.0a", "\u00b2.0"])
def test_a_version_that_is_no_number_is_a_ptx_error(version):
    """Found by mutating PTX: ``.version 8.k4`` raised int()'s ValueError out of the parser."""
    with pytest.raises(PtxError, match="expected MAJOR.MINOR"):
        ptx.parse(f".version {version}\n.target sm_90\n")
