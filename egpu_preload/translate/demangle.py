"""Kernel names for glob matching: the mangled name and its qualified base name.

Probe sections name kernels by glob (``kprobe/vec*``). Running ``c++filt`` in a CUDA process is
fragile (DESIGN.md 3), so this reads just enough of the Itanium C++ ABI mangling (section 5.1) to
recover a function's qualified name without template arguments or parameter types:

    _Z6vecAddPfS_S_i             -> vecAdd
    _Z5scaleIfLi1EEvPT_S0_i      -> scale          (every instantiation of the template)
    _ZN2ns6kernelEPf             -> ns::kernel
    _ZN2ns3VecIfE3addEv          -> ns::Vec::add
    _ZN2at6native40_GLOBAL__N__0f1a8107_8_Shape_cu_49f7391c6kernelEv
                                 -> at::native::(anonymous namespace)::kernel   (as c++filt has it)

A glob matches a kernel when it matches either form (``fnmatch``, case-sensitive). Names outside this
subset (operators, local entities, ``extern "C"``) match by their mangled name only.
"""

from __future__ import annotations

from fnmatch import fnmatchcase


def base_name(mangled: str) -> str | None:
    """The qualified name a mangled function name encodes, or None when it is not one we read."""
    if not mangled.startswith("_Z"):
        return None
    try:
        names, _ = _name(mangled, 2)
    except (IndexError, ValueError):
        return None
    return "::".join(names) if names else None


def matches(glob: str, mangled: str) -> bool:
    if fnmatchcase(mangled, glob):
        return True
    base = base_name(mangled)
    return base is not None and fnmatchcase(base, glob)


def _name(s: str, i: int) -> tuple[list[str], int]:
    if s[i] != "N":
        name, i = _source_name(s, i)
        return [name], _skip_template_args(s, i)
    i += 1
    while s[i] in "rVKRO":  # cv- and ref-qualifiers of a member function
        i += 1
    if s.startswith("St", i):  # ::std::
        names, i = ["std"], i + 2
    else:
        names = []
    while s[i] != "E":
        if s[i] == "I":
            i = _skip_template_args(s, i)
        else:
            name, i = _source_name(s, i)
            names.append(name)
    return names, i + 1


def _source_name(s: str, i: int) -> tuple[str, int]:
    j = i
    while s[j].isdigit():
        j += 1
    if j == i:
        raise ValueError(f"no source name at {i}")
    n = int(s[i:j])
    name = s[j:j + n]
    # An unnamed namespace is _GLOBAL__N plus a per-file hash (section 5.1.4.3 and GCC's, nvcc's forms);
    # tools (c++filt, Nsight, nvcc's messages) and so users call it (anonymous namespace).
    return "(anonymous namespace)" if name.startswith("_GLOBAL__N") else name, j + n


def _skip_template_args(s: str, i: int) -> int:
    """Past an ``I ... E`` template argument list at i (or i itself when there is none)."""
    if i >= len(s) or s[i] != "I":
        return i
    return _skip_group(s, i)


def _skip_group(s: str, i: int) -> int:
    """Past the group that opens at i (I, N, X or J) and its matching E."""
    depth = 0
    while True:
        c = s[i]
        if c.isdigit():        # <source-name>: skip its letters, which may include 'E' or 'I'
            _, i = _source_name(s, i)
            continue
        if c in "ST":          # substitution S_/S0_/St..., template param T_/T0_
            if c == "S" and s[i + 1] in "tabsiod":
                i += 2
                continue
            i += 1
            while s[i] != "_":
                i += 1
        elif c == "L":         # literal: L <type> <value> E, or L _Z <encoding> E
            if s.startswith("_Z", i + 1):   # the encoding's names, closed by the E below
                depth += 1
                i += 3
                continue
            # The type may be a nested name with E's of its own (an enum: LNS0_9SortOrderE0E); the value,
            # digits or lowercase hex, has none.
            i = s.index("E", _skip_type(s, i + 1))
        elif c in "INXJ":      # J: an argument pack (cub's kernels take them)
            depth += 1
        elif c == "E":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1


def _skip_type(s: str, i: int) -> int:
    """Past the type at i of a template-argument literal: a class or enum name (plain, nested or a
    substitution, with its template arguments) or a builtin type."""
    c = s[i]
    if c.isdigit():
        _, i = _source_name(s, i)
    elif c == "N":
        i = _skip_group(s, i)
    elif c == "S":
        if s[i + 1] in "tabsiod":
            i += 2
            if s[i].isdigit():
                _, i = _source_name(s, i)
        else:
            i = s.index("_", i) + 1
    elif c == "D":             # two-letter builtins: Dn (nullptr_t), Di, Ds
        i += 2
    else:
        return i + 1
    return _skip_template_args(s, i)
