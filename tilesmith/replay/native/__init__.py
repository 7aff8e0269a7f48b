"""The lean CUDA-graph replay's address check in C (ptrs.cpp), built once per machine, torch and Python.

The replay's steady state checks, on every call, that each argument still sits where the graph reads it
(tilesmith/replay/graphed.py). In Python that is a `data_ptr()` call per argument: 3.7 us for 51 arguments on the
2-core VM, 4-6 us on the H200's host, half of the replay's own host time. The C check walks the list in
0.3 us. Answers are the same; the C one says False for anything it cannot vouch for, and the caller then
takes its full path, which checks again.

`build()` compiles it (about 20 s: torch's headers) into a cache keyed by the source, torch's version and
commit, and Python's ABI; `tilesmith install` runs it on a CUDA machine. The runtime only loads a build
that exists (`same_ptrs()`) and never compiles inside a user's program: without a build (or with one that
fails to load or its self-test) the replay checks in Python, and `status()` says why.

The cache: TILESMITH_NATIVE_DIR, else $XDG_CACHE_HOME/tilesmith-native (~/.cache/tilesmith-native). It is
shared by every TILESMITH_HOME on the machine, as a compiler's cache is: a build is named by its key.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from tilesmith import settings

SOURCE = Path(__file__).with_name("ptrs.cpp")
NAME = "tilesmith_ptrs"  # the module name ptrs.cpp's PyInit_ function carries

_same = None
_status = "not loaded yet"
_tried = False


def cache_dir() -> Path:
    d = settings.current().native_dir
    if d:
        return Path(d).expanduser().absolute()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser().absolute() / "tilesmith-native"


def _abi() -> int:
    import torch

    return int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))


def key() -> str:
    """What a build depends on: the source, torch (version, commit, C++ ABI) and Python's extension ABI."""
    import torch

    h = hashlib.sha256(SOURCE.read_bytes())
    for part in (torch.__version__, getattr(torch.version, "git_version", ""), str(_abi()),
                 sys.version, sysconfig.get_config_var("EXT_SUFFIX") or ""):
        h.update(b"\0" + str(part).encode())
    return h.hexdigest()[:16]


def path() -> Path:
    return cache_dir() / f"{NAME}-{key()}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def pack(ptrs: list[int]) -> bytes:
    """Addresses as same() reads them."""
    return struct.pack(f"={len(ptrs)}Q", *ptrs)


def same_ptrs():
    """`same(tensors: list, want: bytes) -> bool`, or None where no working build exists (status() says why).
    Loaded once per process; never builds."""
    global _same, _status, _tried
    if not _tried:
        _tried = True
        try:
            _same, _status = _load(path())
        except Exception as e:  # noqa: BLE001 - no C check is never an error: the replay checks in Python
            _same, _status = None, f"not loaded: {type(e).__name__}: {e}"[:300]
    return _same


def status() -> str:
    """Which address check the replay uses, and why: 'C (path)' or the reason it is Python's."""
    same_ptrs()
    return _status


def _load(p: Path):
    if not p.exists():
        return None, f"not built for this torch and Python ({p.name} missing in {p.parent}): `tilesmith install` " \
                     "builds it on a CUDA machine"
    import importlib.machinery
    import importlib.util

    import torch

    loader = importlib.machinery.ExtensionFileLoader(NAME, str(p))
    spec = importlib.util.spec_from_file_location(NAME, str(p), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    fn = mod.same
    a, b = torch.zeros(2), torch.zeros(3)  # a self-test before any replay trusts it
    ok = (fn([a, b], pack([a.data_ptr(), b.data_ptr()])) is True and fn([a, b], pack([a.data_ptr(), a.data_ptr()])) is False
          and fn([a, 1], pack([a.data_ptr(), 0])) is False and fn([a], pack([a.data_ptr(), 0])) is False)
    if not ok:
        return None, f"self-test failed: {p}"
    return fn, f"C ({p})"


def build(timeout_s: float = 300) -> tuple[Path | None, str]:
    """Compile ptrs.cpp for this torch and Python into the cache, unless built already. Returns (path, what
    happened) or (None, why not); never raises for a missing compiler or a failed compile."""
    global _tried
    from torch.utils import cpp_extension

    out = path()
    if out.exists():
        return out, f"built already: {out}"
    cxx = os.environ.get("CXX") or "c++"
    libdir = cpp_extension.library_paths()[0]
    cmd = [cxx, "-O2", "-shared", "-fPIC", "-std=c++17", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={_abi()}",
           *[f"-I{d}" for d in cpp_extension.include_paths()], f"-I{sysconfig.get_paths()['include']}", str(SOURCE),
           f"-L{libdir}", "-ltorch_python", "-ltorch", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{libdir}"]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{NAME}-", suffix=".so", dir=out.parent)
        os.close(fd)
    except OSError as e:
        return None, f"cannot write the cache {out.parent}: {e}"
    try:
        p = subprocess.run([*cmd, "-o", tmp], capture_output=True, text=True, timeout=timeout_s)
        if p.returncode != 0:
            return None, f"{cxx} failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()[-800:]}"
        os.replace(tmp, out)  # whole or not at all: a concurrent build writes its own temporary file
    except FileNotFoundError:
        return None, f"no C++ compiler ({cxx}; set CXX): the replay checks addresses in Python"
    except subprocess.TimeoutExpired:
        return None, f"{cxx} ran past {timeout_s:g} s"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _tried = False  # the next same_ptrs() in this process loads the new build
    return out, f"built: {out}"
