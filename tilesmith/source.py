"""Wrapper source text: canonical form, graph key, and the FX-program comment header.

Stdlib only. The canonical form removes what varies between processes or machines for the same
graph (research note inductor-hooks.md §3): the process-global AOT id, Triton kernel-path comments,
id-based hashes on constant headers, and cache-directory paths.
"""

from __future__ import annotations

import hashlib
import os
import re

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
