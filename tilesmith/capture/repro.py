"""The runnable repro of the exact graph Inductor lowered (`CompiledFxGraph.runnable_graph_str`), kept so
the tuner can lower the graph again under other Inductor configs (tilesmith/search/relower.py).

The repro is Python that defines `class Repro(nn.Module)` whose forward is the post-AOT graph Inductor
received (before its post-grad passes), plus the non-default Inductor/Dynamo configs in effect at
compile time. Its buffers (tensor constants) are serialized only when tiny (<= 4 elements); larger ones
are written as `torch.randn(...)` placeholders. We bind each of those by name to the constant the
wrapper received (same name, shape and dtype); a buffer that cannot be bound makes re-lowering
unavailable, with the reason. Stdlib only: capture and the worker both use it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

REPRO_FILE = "repro.py"

_BUFFER = re.compile(r"^\s*self\.register_buffer\('(\w+)', (.*)\)\s*$", re.M)
_PARAM = re.compile(r"^\s*self\.(\w+) = torch\.nn\.Parameter\(", re.M)
# Paths of the capturing machine's caches: the worker must use its own.
_CACHE_ENV = re.compile(r"^os\.environ\['(TORCHINDUCTOR_CACHE_DIR|TRITON_CACHE_DIR)'\] = .*$", re.M)


@dataclass
class ReproStatus:
    """Whether the stored repro can be lowered again with the captured constants."""

    available: bool
    reason: str = ""  # why not, when not available
    inline: list[str] = field(default_factory=list)  # buffers serialized exactly in the text
    bound: list[str] = field(default_factory=list)  # buffers taken from the captured constants by name

    def to_dict(self) -> dict:
        return asdict(self)


def clean(text: str) -> str:
    """The repro without the capturing machine's cache paths (they would redirect the worker's caches)."""
    return _CACHE_ENV.sub("", text)


def placeholders(text: str) -> list[str]:
    """The forward's argument names, in order (the graph's inputs)."""
    m = re.search(r"def forward\(self,?\s*(.*?)\):", text, re.S)
    return [a.strip() for a in m.group(1).split(",") if a.strip()] if m else []


def status(text: str | None, constants: dict) -> ReproStatus:
    """Check a repro against the wrapper's constants ({name: tensor-like with .shape/.dtype})."""
    if not text:
        return ReproStatus(False, "Inductor kept no runnable repro of this graph (runnable_graph_str is empty)")
    if "class Repro(" not in text:
        return ReproStatus(False, "the repro does not define class Repro")
    params = _PARAM.findall(text)
    if params:
        return ReproStatus(False, f"the repro has parameters ({', '.join(params[:3])}): their values are not kept")
    st = ReproStatus(True)
    for name, expr in _BUFFER.findall(text):
        if not expr.startswith(("torch.randn(", "torch.randint(")):
            st.inline.append(name)
            continue
        c = constants.get(name)
        if c is None or not hasattr(c, "shape"):
            return ReproStatus(False, f"constant {name} of the lowered graph is not among the wrapper's constants: "
                                      "its value was not kept", st.inline, st.bound)
        shape = re.search(r"\[([\d, ]*)\]", expr)
        want = [int(x) for x in shape.group(1).split(",") if x.strip()] if shape else None
        if want is not None and list(c.shape) != want:
            return ReproStatus(False, f"constant {name}: shape {list(c.shape)} in the wrapper, {want} in the repro",
                               st.inline, st.bound)
        st.bound.append(name)
    return st
