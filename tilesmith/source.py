"""Wrapper source text: canonical form, graph key, the FX-program comment header, and the kernels it defines.

Stdlib only. The canonical form removes what varies between processes or machines for the same
graph (research note inductor-hooks.md §3): the process-global AOT id, Triton kernel-path comments,
id-based hashes on constant headers, and cache-directory paths.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
from dataclasses import dataclass, field

from tilesmith.environment import canonical_json

HEADER_BEGIN = "# ==== tilesmith: FX program (post-grad, read-only) ===="
HEADER_END = "# ==== tilesmith: end of FX program; the wrapper follows ===="

_RULES = [
    # '# AOT ID: ['0_forward']': a per-process counter. Keep the kind suffix, drop the number.
    (re.compile(r"^# AOT ID: \['\d+_(\w+)'\]$", re.M), r"# AOT ID: ['<n>_\1']"),
    (re.compile(r"^(\s*# kernel path: ).*$", re.M), r"\1<kernel-path>"),
    # '_tensor_constant0 = None  # device(type='cpu') torch.float32 (64,) (1,) 7f2cbfe80d20': id hash.
    (re.compile(r"^(\w+ = None  # device\(.*?\) torch\.\w+ \(.*?\) \(.*?\)) [0-9a-f]+$", re.M), r"\1 <hash>"),
    (re.compile(r"/tmp/torchinductor_[^/\s'\"]+"), "<cache-dir>"),
]


def canonicalize(src: str, cache_dirs: tuple[str, ...] = ()) -> str:
    """The wrapper text with process- and machine-specific noise removed; still valid Python."""
    for rx, rep in _RULES:
        src = rx.sub(rep, src)
    dirs = set(cache_dirs) | {os.environ.get("TORCHINDUCTOR_CACHE_DIR") or ""}
    for d in sorted(dirs - {""}, key=len, reverse=True):
        src = src.replace(d, "<cache-dir>")
    return "\n".join(line.rstrip() for line in src.strip().splitlines()) + "\n"


def graph_key(canonical_src: str, env: dict) -> str:
    """64-hex SHA-256 of the canonical wrapper source plus the environment fingerprint."""
    h = hashlib.sha256()
    h.update(canonical_src.encode())
    h.update(b"\0")
    h.update(canonical_json(env).encode())
    return h.hexdigest()


def add_header(fx_program: str, src: str) -> str:
    """Put the FX program above the wrapper as comments between marker lines."""
    body = "\n".join(("# " + line).rstrip() for line in fx_program.strip("\n").splitlines())
    return f"{HEADER_BEGIN}\n{body}\n{HEADER_END}\n{src}"


def split_header(text: str) -> tuple[str, str]:
    """(FX program, wrapper source). Text without a header gives ('', text) unchanged."""
    if not text.startswith(HEADER_BEGIN + "\n"):
        return "", text
    end = text.find("\n" + HEADER_END + "\n")
    if end < 0:
        return "", text
    header = text[len(HEADER_BEGIN) + 1 : end]
    fx = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in header.splitlines())
    return fx, text[end + len(HEADER_END) + 2 :]


def key_of_text(text: str, env: dict) -> str:
    """Graph key of a wrapper file's text (header or not)."""
    return graph_key(canonicalize(split_header(text)[1]), env)


# -- the kernels a wrapper defines ---------------------------------------------------------------

@dataclass
class Kernel:
    """A kernel a wrapper defines at module level: `name = async_compile.<triton|cpp_pybinding|cpp>(..., <source>, ...)`,
    the source a string literal, located with `ast`."""

    name: str  # the module global, e.g. triton_poi_fused_add_0 / cpp_fused_relu_1
    kind: str  # triton | template | cpp
    code: str  # the kernel source inside the string literal
    span: tuple[int, int]  # character offsets of the literal in the wrapper text
    params: dict = field(default_factory=dict)  # what the tuner may change (search/kernels.py reads it)


def kernels_in(src: str) -> list[Kernel]:
    """Every kernel defined through async_compile in `src` (the wrapper, no FX header), in source order."""
    tree = ast.parse(src)
    starts = _line_starts(src)
    found = []
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        call = node.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name) and call.func.value.id == "async_compile"):
            continue
        method = call.func.attr
        lit = next((a for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str) and "\n" in a.value), None)
        if lit is None or method not in ("triton", "cpp_pybinding", "cpp"):
            continue
        name = node.targets[0].id
        kind = "cpp" if method.startswith("cpp") else ("template" if "triton_tem_" in name else "triton")
        span = (starts[lit.lineno - 1] + lit.col_offset, starts[lit.end_lineno - 1] + lit.end_col_offset)
        found.append(Kernel(name, kind, lit.value, span))
    return found


def replace_kernel(src: str, kernel: Kernel, new_code: str) -> str:
    """`src` with `kernel`'s string literal replaced by one holding `new_code`."""
    quote = "'''" if "'''" not in new_code else '"""'
    a, b = kernel.span
    return src[:a] + "r" + quote + new_code + quote + src[b:]


def _line_starts(src: str) -> list[int]:
    starts, pos = [0], 0
    for line in src.splitlines(keepends=True):
        pos += len(line)
        starts.append(pos)
    return starts
