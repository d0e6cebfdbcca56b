"""PTX modules as data: a parser and printer that round-trip any module byte for byte.

A module is a list of top-level items laid over its text: header lines (``.version``, ``.target``,
``.address_size``), functions (``.entry``/``.func`` definitions) and raw text for everything else
(comments, ``.file``, variables, ``.extern`` prototypes, ``.section`` debug data). Every item keeps its
span, so printing an unchanged module is concatenation. A function's body is parsed only when asked
(``Function.statements``): a flat list of statements with their spans and nesting depth. Rewriters
describe changes as ``Edit``s at statement boundaries; ``Module.render`` applies them. Nothing here
searches PTX for substrings.

PTX ISA 9.0 section 4 (syntax): statements end in ``;``; labels end in ``:``; ``{ }`` opens a scope
(and also groups vector operands inside a statement); ``.loc`` and ``.file`` end at the line's end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from egpu_preload.errors import PtxError

# Comments, strings and the characters that shape the top level. Every alternative starts with a literal
# (no character class), so that re skips to the next candidate character in C: 5x faster over a body.
_TOKEN = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"|;|\{|\}|\(|\)|=', re.S)
_BRACE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"|\{|\}', re.S)
_SPACE = re.compile(r'(?:\s+|//[^\n]*|/\*.*?\*/)*', re.S)
_SPACES = re.compile(r'(?:\s+|//[^\n]*|/\*.*?\*/)+', re.S)
_HEADER_DIRECTIVES = (".version", ".target", ".address_size")
# To the line's end: these, and a word that only starts like a header directive (".versionX": ptxas refuses it).
_LINE_DIRECTIVES = (".file", ".loc", *_HEADER_DIRECTIVES)

# One statement-level token of a function body (section 4.3: statements, labels, scopes).
# A body token after any whitespace and comments (one match for both: bodies are mostly lines), or
# the end (no group). The skip is atomic: nested repetition over a run of blanks would otherwise try
# every split of the run before failing (exponential in its length on a bad statement).
# An instruction of the plain shape (an optional "@pred " guard, then an opcode of ASCII word characters,
# dots and colons, then operands without comments) comes out split into its parts (insn), which saves
# _statement's Python work; _statement splits any other (a directive, an odd guard or opcode, a comment
# inside) the same way.
_BLANKS = r"(?>(?:\s+|//[^\n]*|/\*.*?\*/)*)"
# A statement's text up to its ';': {} groups (vector operands), strings and lone slashes included;
# _TAIL_C takes comments too (ptxas reads them as white space anywhere, section 4.2), in {} groups as well, so that
# _statement drops them: a '[%rd9]' in one is no address, a '}' in one does not close the group.
_TAIL = r'[^;{}"/]*+(?:(?:\{[^{}/]*+\}|"[^"]*+"|/(?![/*]))[^;{}"/]*+)*+'
_TAIL_C = r'[^;{}"/]*+(?:(?:\{(?:[^{}/]++|//[^\n]*+|/\*.*?\*/)*+\}|"[^"]*+"|//[^\n]*+|/\*.*?\*/|/(?![/*]))[^;{}"/]*+)*+'
_BODY = re.compile(_BLANKS + rf"""
    (?: (?P<open>\{{)
      | (?P<close>\}})
      | (?P<line>\.(?:loc|file)\b[^\n]*)
      | (?P<label>[$%A-Za-z_][\w$]*+[ \t]*+:(?!:))
      | (?P<insn>(?:@(?P<pred>!?[$%0-9A-Za-z_]++)\s++)?(?P<opcode>(?P<op>[0-9A-Za-z_:]++)[0-9A-Za-z_.:]*+)
                 (?![^\s;])\s*+(?!\.)(?P<args>{_TAIL}));
      | (?P<stmt>{_TAIL_C};)
      | \Z)
""", re.X | re.S)

_DECLARED = re.compile(r"([$%A-Za-z_][\w$]*)\s*(?:\[[^\]]*\]\s*)*[=;]")
# A module-level .const variable (section 5.4): linkage, .const, attributes (.align N, a vector, the type),
# the name and its array sizes, then the initializer or ';'.
_CONST_VAR = re.compile(r"""(?P<link>(?:\.(?:visible|weak|common|extern)\s+)*)\.const\s+
                            (?P<attrs>(?:\.\w+\s+(?:\d+\s+)?)*)[$%A-Za-z_][\w$]*\s*
                            (?P<dims>(?:\[[^\]]*\]\s*)*)[=;]""", re.X)
_HEADER = re.compile(r"""
    (?P<pre>(?:\.\w+\s+)*?)\.(?P<kind>entry|func)\b\s*
    (?:\((?P<ret>[^()]*)\)\s*)?
    (?P<name>[$%A-Za-z_][\w$]*)\s*
    (?:\((?P<params>[^()]*)\))?
""", re.X | re.S)

# Sizes of PTX fundamental types in bytes (section 5.2.2).
TYPE_SIZES = {
    "b8": 1, "u8": 1, "s8": 1, "e4m3": 1, "e5m2": 1,
    "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2,
    "b32": 4, "u32": 4, "s32": 4, "f32": 4, "f16x2": 4, "bf16x2": 4, "tf32": 4,
    "b64": 8, "u64": 8, "s64": 8, "f64": 8,
    "b128": 16,
    "pred": 0,
}


@dataclass(frozen=True)
class Param:
    name: str
    type: str          # "u64", "b8", ...
    size: int          # bytes of the whole parameter (arrays: element size * count)
    align: int


# Statements are made once per line of every instrumented kernel: plain (not frozen) dataclasses,
# whose construction costs a third as much; nothing mutates them.
@dataclass(eq=False, slots=True)
class Stmt:
    start: int         # span in the module text (no leading whitespace)
    end: int
    depth: int         # 1 = the function's outermost scope


@dataclass(eq=False, slots=True)
class Instruction(Stmt):
    pred: str | None   # "%p1", "!%p1" (the guard without "@")
    opcode: str        # "ld.global.v4.f32"
    args: str          # the operand text, split on demand (most instructions are never asked)
    op: str            # the opcode's first part: "ld" of "ld.global.v4.f32"
    _operands: tuple[str, ...] | None = field(default=None, repr=False)

    @property
    def parts(self) -> list[str]:
        return self.opcode.split(".")

    @property
    def operands(self) -> tuple[str, ...]:
        if self._operands is None:
            self._operands = tuple(split_operands(self.args))
        return self._operands


@dataclass(eq=False, slots=True)
class Label(Stmt):
    name: str


@dataclass(eq=False, slots=True)
class Directive(Stmt):
    name: str          # ".reg", ".loc", ".pragma", ".param", ...
    text: str


@dataclass(eq=False, slots=True)
class Open(Stmt):
    pass


@dataclass(eq=False, slots=True)
class Close(Stmt):
    pass


@dataclass(frozen=True)
class Edit:
    """Replace text[start:end] with ``text`` (start == end inserts)."""

    start: int
    end: int
    text: str


@dataclass
class Function:
    # The module's text, not the module: no reference cycle, so that a module and its statements go when
    # the last reference does and not at the cyclic collector's next pass over all of them.
    text: str = field(repr=False)
    start: int
    end: int                 # after the closing brace (or ';' for a prototype)
    kind: str                # "entry" | "func"
    name: str
    linkage: tuple[str, ...]     # ".visible", ".weak", ".extern", ...
    params: tuple[Param, ...] | None  # None: the header did not parse
    params_end: int | None   # offset of the ')' closing the parameter list
    body_open: int | None    # offset of '{' (None: a declaration)
    _stmts: list[Stmt] | None = field(default=None, repr=False)

    @property
    def is_kernel(self) -> bool:
        return self.kind == "entry" and self.body_open is not None

    def statements(self) -> list[Stmt]:
        """The body as statements, parsed on first use; PtxError for text that is not PTX."""
        if self._stmts is None:
            if self.body_open is None:
                raise PtxError(f"{self.name}: a declaration has no body")
            self._stmts = _parse_body(self.text, self.body_open + 1, self.end - 1)
        return self._stmts


@dataclass
class Module:
    text: str
    items: list[tuple[int, int]]       # spans of top-level items, in order, covering the text
    functions: list[Function]
    version: tuple[int, int] | None
    version_span: tuple[int, int] | None   # the "X.Y" of .version
    target: str | None                 # "sm_90a"
    target_span: tuple[int, int] | None    # the first target token
    header_end: int                    # after the last header line: where new declarations go

    def kernels(self) -> list[Function]:
        return [f for f in self.functions if f.is_kernel]

    def declared(self) -> set[str]:
        """The names declared at the top level: functions, and variables (the name before an optional
        array size and the initializer or ';', section 5.4)."""
        names = {f.name for f in self.functions}
        spans = {(f.start, f.end) for f in self.functions}
        for start, end in self.items:
            if (start, end) not in spans and self.text.startswith((".global", ".const", ".shared", ".local", ".visible",
                                                                   ".extern", ".weak", ".common"), start):
                m = _DECLARED.search(self.text, start, end)
                if m is not None:
                    names.add(m.group(1))
        return names

    def const_bytes(self, start: int = 0) -> int:
        """Where the module's own ``.const`` variables end in the constant bank, laid out from byte ``start``,
        each at its alignment in the order declared (``.extern`` ones are another module's; an array of
        unknown size counts 0)."""
        spans = {(f.start, f.end) for f in self.functions}
        end = start
        for begin, stop in self.items:
            m = None if (begin, stop) in spans else _CONST_VAR.match(self.text, begin, stop)
            if m is None or ".extern" in m.group("link"):
                continue
            attrs = m.group("attrs").split()
            types = [a[1:] for a in attrs if a[1:] in TYPE_SIZES]
            if not types:
                continue
            # a vector is aligned to its whole size unless .align says otherwise (section 5.4.5)
            size = TYPE_SIZES[types[0]] * next((int(a[2:]) for a in attrs if a[:2] == ".v" and a[2:].isdigit()), 1)
            align = integer(attrs[attrs.index(".align") + 1]) if ".align" in attrs[:-1] else size
            for dim in re.findall(r"\[([^\]]*)\]", m.group("dims")):
                size *= integer(dim.strip()) if dim.strip() else 0
            end = -(-end // max(align, 1)) * max(align, 1) + size
        return end

    def render(self, edits: list[Edit]) -> str:
        """The module text with non-overlapping edits applied (an empty list gives the text back)."""
        out, pos = [], 0
        for e in sorted(edits, key=lambda e: (e.start, e.end)):
            if e.start < pos:
                raise PtxError(f"overlapping edits at offset {e.start}")
            out += (self.text[pos:e.start], e.text)
            pos = e.end
        out.append(self.text[pos:])
        return "".join(out)


def parse(text: str) -> Module:
    """Split a module into top-level items; PtxError when braces or statements do not close."""
    mod = Module(text, [], [], None, None, None, None, 0)
    pos, n = 0, len(text)
    while True:
        pos = _SPACE.match(text, pos).end()
        if pos >= n:
            break
        start = pos
        m = _HEADER_LINE.match(text, pos) if text.startswith(_HEADER_DIRECTIVES, pos) else None
        if m is not None:
            pos = m.end()
            _header_line(mod, m)
        elif text.startswith(_LINE_DIRECTIVES, pos):
            pos = _line_end(text, pos)
        elif text.startswith(".section", pos):
            pos = _matching_brace(text, _find(text, "{", pos)) + 1
        else:
            pos = _top_item(mod, start)
        mod.items.append((start, pos))
    return mod


def _line_end(text: str, pos: int) -> int:
    end = text.find("\n", pos)
    return len(text) if end < 0 else end


def _find(text: str, ch: str, pos: int) -> int:
    i = text.find(ch, pos)
    if i < 0:
        raise PtxError(f"expected {ch!r} after offset {pos}")
    return i


def _header_line(mod: Module, m: re.Match[str]) -> None:
    kind, first = m.group("kind", "first")
    if kind == "version" and first is not None:
        major, _, minor = first.partition(".")
        if not all(part.isascii() and part.isdigit() for part in (major, minor or "0")):   # isdigit: '²' too
            raise PtxError(f".version {first}: expected MAJOR.MINOR")
        mod.version = (int(major), int(minor or 0))
        mod.version_span = m.span("first")
    elif kind == "target" and first is not None:
        mod.target = first
        mod.target_span = m.span("first")
    mod.header_end = m.end()


def _matching_brace(text: str, open_pos: int) -> int:
    depth = 0
    for m in _BRACE.finditer(text, open_pos):
        c = m.group()
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return m.start()
    raise PtxError(f"unclosed '{{' at offset {open_pos}")


def _top_item(mod: Module, start: int) -> int:
    """One declaration or definition starting at ``start``; returns the offset after it."""
    text, parens, init, pos = mod.text, 0, False, start
    while (m := _TOKEN.search(text, pos)) is not None:
        c, pos = m.group(), m.end()
        if c == "(":
            parens += 1
        elif c == ")":
            parens -= 1
        elif c == "=":
            init = True
        elif c == ";" and parens == 0:
            _function(mod, start, m.end(), None)
            return m.end()
        elif c == "{" and parens == 0:
            close = _matching_brace(text, m.start())
            if init:  # an initializer list: the declaration goes on to its ';'
                pos = close + 1
                continue
            _function(mod, start, close + 1, m.start())
            return close + 1
        elif c == "}":
            raise PtxError(f"unexpected '}}' at offset {m.start()}")
    raise PtxError(f"unterminated declaration at offset {start}")


def _function(mod: Module, start: int, end: int, body_open: int | None) -> None:
    head_end = body_open if body_open is not None else end
    # Matched with its comments blanked (ptxas reads them as white space, section 4.2): one between the
    # linkage and .entry hid the kernel, a ')' in one ended the parameter list there.
    head = blank_comments(mod.text[start:head_end])
    m = _HEADER.match(head)
    if m is None:
        return  # a variable or other declaration: raw text
    params = params_end = None
    if m.group("params") is not None:
        params_end = start + m.end("params")
        params = _params(m.group("params"))
    linkage = tuple(head[:m.start("kind") - 1].split())
    mod.functions.append(Function(mod.text, start, end, m.group("kind"), m.group("name"), linkage,
                                  params, params_end, body_open))


def blank_comments(text: str) -> str:
    """``text`` with each comment's characters but newlines turned to spaces: the same offsets, no comments."""
    if "/" not in text:
        return text
    return _COMMENT.sub(lambda m: m.group(1) or re.sub(r"[^\n]", " ", m.group()), text)


# Of the attributes only .align takes a number, and it must (section 5.4.5).
_PARAM = re.compile(r"\.param\s+(?P<attrs>(?:\.align\s+\d+\s+|\.(?!align\b)[\w:]+\s+)*)(?P<name>[$%A-Za-z_][\w$]*)"
                    r"\s*(?P<array>\[\s*(?P<count>\d*)\s*\])?\s*$")


def _params(text: str) -> tuple[Param, ...] | None:
    out = []
    for raw in text.split(","):
        raw = _SPACES.sub(" ", raw).strip()
        if not raw:
            continue
        m = _PARAM.match(raw)
        if m is None:
            return None
        attrs = m.group("attrs").split()
        types = [a[1:] for a in attrs if a[1:] in TYPE_SIZES]
        if not types:
            return None
        count = 1 if m.group("array") is None else int(m.group("count") or 0)   # [] or [0]: no size to read
        size = TYPE_SIZES[types[0]] * count
        # With .ptr, .align is the pointee's alignment (PTX ISA 5.1.6.1), not the parameter's.
        explicit = ".align" in attrs and ".ptr" not in attrs
        align = int(attrs[attrs.index(".align") + 1]) if explicit else TYPE_SIZES[types[0]]
        if size <= 0 or align <= 0 or align & (align - 1):   # alignments are powers of two (ptxas)
            return None
        out.append(Param(m.group("name"), types[0], size, align))
    return tuple(out)


def _parse_body(text: str, start: int, end: int) -> list[Stmt]:
    stmts: list[Stmt] = []
    depth, pos = 1, start
    match = _BODY.match
    while pos < end:
        m = match(text, pos, end)
        if m is None:
            bad = _SKIP.match(text, pos, end).end()   # the statement after the blanks and comments
            line = text.count("\n", 0, bad) + 1
            raise PtxError(f"line {line}: cannot parse {text[bad:bad + 40]!r}")
        kind = m.lastgroup
        if kind is None:   # only whitespace and comments were left
            break
        s, pos = m.start(kind), m.end()
        if kind == "insn":
            stmts.append(Instruction(s, pos, depth, *m.group("pred", "opcode", "args", "op")))
        elif kind == "stmt":
            stmts.append(_statement(text, s, pos, depth))
        elif kind == "label":
            stmts.append(Label(s, pos, depth, text[s:pos - 1].strip()))
        elif kind == "line":
            stmts.append(Directive(s, pos, depth, text[s:pos].split(None, 1)[0], text[s:pos]))
        elif kind == "open":
            depth += 1
            stmts.append(Open(s, pos, depth))
        elif kind == "close":
            stmts.append(Close(s, pos, depth))
            depth -= 1
            if depth < 1:
                raise PtxError(f"unbalanced '}}' at offset {s}")
    if depth != 1:
        raise PtxError("unbalanced '{' in function body")
    return stmts


_SKIP = re.compile(_BLANKS, re.S)
# .version, .target and .address_size with their operands, which ptxas reads across blanks, comments and line
# breaks as anywhere else (".target/**/sm_90", ".target\nsm_90, debug"); the next directive is no operand.
_HEADER_LINE = re.compile(rf"""\.(?P<kind>version|target|address_size)\b
    (?:{_BLANKS}(?P<first>(?!\.[A-Za-z_])[\w.]++)(?:{_BLANKS},{_BLANKS}\w[\w.]*+)*+)?""", re.X | re.S)
_GUARD = re.compile(r"@\s*(!?)\s*([$%\w]+)\s*")
_COMMENT = re.compile(r'("(?:[^"\\\n]|\\.)*")|//[^\n]*|/\*.*?\*/', re.S)
# The opcode and the operands; ptxas reads "ld .global.f32" (and "ld.global/**/.f32") as "ld.global.f32", and
# "ld.global.f32%f1,[%rd1]" as "ld.global.f32 %f1, [%rd1]": an opcode is word characters, dots and colons.
_OPCODE = re.compile(r"([\w.:]*(?:\s+\.[\w.:]*)*)\s*(.*)", re.S)


def _statement(text: str, start: int, end: int, depth: int) -> Stmt:
    body = text[start:end - 1]
    if "/" in body:
        body = _COMMENT.sub(lambda m: m.group(1) or " ", body)
    if body.startswith("."):
        return Directive(start, end, depth, body.split(None, 1)[0], body)
    pred = None
    if body[:1] == "@":
        g = _GUARD.match(body)
        if g is None:
            raise PtxError(f"bad guard in {body!r}")
        pred, body = g.group(1) + g.group(2), body[g.end():]
    opcode, args = _OPCODE.match(body).groups()
    opcode = "".join(opcode.split())
    return Instruction(start, end, depth, pred, opcode, args, opcode.partition(".")[0])


# PTX ISA 4.5.1: hexadecimal, binary, octal (a leading 0) or decimal, each with an optional U.
_INTEGER = re.compile(r"-?(?:0[xX][0-9a-fA-F]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)U?")


def integer(text: str) -> int:
    """The value of a PTX integer literal; PtxError for anything else."""
    if _INTEGER.fullmatch(text) is None:
        raise PtxError(f"expected an integer, got {text!r}")
    digits = text.removesuffix("U")
    sign, digits = (-1, digits[1:]) if digits[0] == "-" else (1, digits)
    octal = digits[0] == "0" and digits[1:2].isdigit()
    return sign * (int(digits, 8) if octal else int(digits, 0))


# One operand: anything but a top-level comma; (), [] and {} groups nest one level deep, which is
# all PTX has (a texture's "[%rd6, {%r2}]" is the deepest, section 9.7.9.3).
_OPERAND = re.compile(r"(?:[^,\[\]{}()]|\[[^\]]*\]|\{[^}]*\}|\([^)]*\))+")


def split_operands(text: str) -> list[str]:
    """Comma-separated operands at nesting level 0 of (), [] and {} (section 4.6), whitespace-trimmed."""
    return [o.strip() for o in _OPERAND.findall(text) if o.strip()]


def call_target(operands: tuple[str, ...]) -> tuple[str | None, list[str]]:
    """call[.uni] [(rets),] target, [(args)][, proto] (PTX ISA, call): the target (a function's name, or the
    register of an indirect call) and the argument slot names."""
    rest = list(operands)
    if rest and rest[0].startswith("("):
        rest.pop(0)
    if not rest:
        return None, []
    target = rest[0].strip()
    args = rest[1].strip() if len(rest) > 1 and rest[1].strip().startswith("(") else "()"
    return target, [a.strip() for a in args[1:-1].split(",") if a.strip()]
