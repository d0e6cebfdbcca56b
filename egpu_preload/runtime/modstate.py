"""Module state: the ``__device__`` and ``__constant__`` variables a module's PTX defines, which a hot
swap copies from the image launches ran on to the image they will run on (live.py).

PTX ISA 9.0 section 5.1 (state spaces): ``.global`` and ``.const`` variables are per module; section
11.6 (linking directives): ``.extern`` declares one defined elsewhere (nothing to copy). egpu's own
module-level names (``__egpu_*``: map tables, launch ids) are the runtime's, never copied.
"""

from __future__ import annotations

import re

from egpu_preload.translate import ptx

# [linking directives] .global|.const [.align N] [vector] type NAME  (then [N], = init, or ;)
_VAR = re.compile(r"""^(?P<link>(?:\.(?:visible|weak|common|extern)\s+)*)
                      \.(?:global|const)\b[^;=\[]*?(?P<name>[$%A-Za-z_][\w$]*)\s*(?:\[|=|;)""", re.X | re.S)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
OWN_PREFIX = "__egpu_"


def module_globals(text: str) -> list[str]:
    """Names of the .global and .const variables ``text`` defines, in order, egpu's own left out."""
    mod = ptx.parse(text)
    functions = {(f.start, f.end) for f in mod.functions}
    names = []
    for start, end in mod.items:
        if (start, end) in functions:
            continue
        m = _VAR.match(_COMMENT.sub(" ", text[start:end]).strip())
        if m and ".extern" not in m.group("link") and not m.group("name").startswith(OWN_PREFIX):
            names.append(m.group("name"))
    return names
