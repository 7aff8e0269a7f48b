"""Adversarial and honest candidate wrappers for the gate's tests, made by editing a real captured wrapper.

Each maker takes the original wrapper text (FX header + Inductor's wrapper) and returns a candidate
that keeps call(args) and differs in one way a cheat or a bug would.
"""

from __future__ import annotations

import re
from pathlib import Path

CLEAR = "        args.clear()\n"


# The gate's word that the machine was too busy to time a decision (in each of timing.UNSTABLE_PASSES passes), which is
# what a decision of the original against itself may end with when two test suites share the 2 cores: not accepted,
# and no verdict on the candidate. Tests of A/A decisions take it beside "not-faster".
TOO_BUSY = ["unstable-timing"]


def settled(decide):
    """`decide()` (a gate decision), made once more where the gate said the machine was too busy to time it
    (exactly `unstable-timing`: the original itself ran several times slower beside the candidate, or in its own
    worker, than alone). That is no verdict on the candidate; a user would run it again. Seen with two test suites
    side by side on the 2 cores."""
    v = decide()
    for _ in range(2):  # up to three decisions, as `shown`
        if v.codes != ["unstable-timing"]:
            break
        v = decide()
    return v


def shown(decide):
    """`decide()` (a gate decision, or a submit's result) made again where the candidate, a genuine win, was rejected
    at timing for what a loaded machine does (timing_only): measured faster but not beyond the noise, or its worker
    slow as a whole for a pass. A user would run it again. Seen with two test suites side by side on the 2 cores: a
    2.1x win read a lower bound of 0.95x in a 16 s budget, a 2.5x win 0.64x in 2 s."""
    r = decide()
    for _ in range(2):  # up to three decisions: CI, 2026-12-07, a win not shown twice in a row beside another suite
        if not timing_only(r):
            break
        r = decide()
    return r


def timing_only(r) -> bool:
    """Whether the verdict (as not_shown takes it) was rejected at timing alone, `not-faster` or `unstable-timing`: on a
    loaded machine a genuine win can read either (benchmarks/RESULTS.md, the gate on a busy machine: the candidate's
    worker slow for a whole pass reads 0.1x). Never a correctness, static or forged-timing rejection."""
    v = r if isinstance(r, dict) else r.verdict if isinstance(getattr(r, "verdict", None), dict) else None
    codes = [x.get("code") for x in v.get("reasons", [])] if v is not None else list(r.codes)
    accepted = v.get("accepted") if v is not None else r.accepted
    return not accepted and bool(codes) and set(codes) <= {"not-faster", "unstable-timing"}


def not_shown(r) -> bool:
    """Whether the verdict (a Verdict, a verdict as a dict (a run's profiles/verdict_NNN.json), or a submit's result
    holding one as a dict) is `not-faster` alone with a measured speedup above 1: faster, but not beyond the noise."""
    v = r if isinstance(r, dict) else r.verdict if isinstance(getattr(r, "verdict", None), dict) else None
    if v is not None:
        codes = [x.get("code") for x in v.get("reasons", [])]
        speedup = ((v.get("first") or {}).get("timing") or {}).get("speedup") or 0
    else:
        codes, t = r.codes, (getattr(r.first, "timing", None) if r.first else None)
        speedup = getattr(t, "speedup", 0) or 0
    return codes == ["not-faster"] and speedup > 1.0


def graph_of(ws: Path) -> Path:
    """The single graph directory of a workspace."""
    dirs = sorted((Path(ws) / "graphs").iterdir())
    assert len(dirs) == 1, dirs
    return dirs[0]


def _after_clear(text: str, code: str) -> str:
    assert CLEAR in text
    body = "".join(f"        {line}\n" for line in code.strip("\n").splitlines())
    return text.replace(CLEAR, CLEAR + body, 1)


def _return_name(text: str) -> str:
    m = re.search(r"^        return \((\w+), \)$", text, re.M)
    assert m, "expected a single-output wrapper"
    return m.group(1)


def _first_arg(text: str) -> str:
    m = re.search(r"^        (\w+)(?:, \w+)* = args$", text, re.M)
    return m.group(1)


def _before_return(text: str, code: str) -> str:
    name = _return_name(text)
    line = f"        return ({name}, )\n"
    body = "".join(f"        {x}\n" for x in code.strip("\n").splitlines())
    return text.replace(line, body + line, 1)


def caches_outputs_by_pointer(text: str) -> str:
    """Remembers outputs keyed on the first input's address (the CUDA-L1 cache)."""
    a = _first_arg(text)
    text = _after_clear(text, f"_ptr = {a}.data_ptr()\nfor _key, _out in self.partitions:\n    if _key == _ptr:\n"
                              "        return _out")
    name = _return_name(text)
    return _before_return(text, f"self.partitions.append((_ptr, ({name}, )))")


def reuses_output_buffer(text: str) -> str:
    """Allocates the output once and hands the same tensor back every call."""
    name = _return_name(text)
    m = re.search(rf"^        {name} = (empty_strided_cpu\(.*\))$", text, re.M)
    if m is None:  # the output is a reused buffer: find the buffer it reuses
        src = re.search(rf"^        {name} = (\w+); del \w+  # reuse$", text, re.M).group(1)
        m = re.search(rf"^        {src} = (empty_strided_cpu\(.*\))$", text, re.M)
    alloc = m.group(1)
    line = m.group(0)
    lhs = line.split(" = ")[0].strip()
    new = (f"        if not self.partitions:\n            self.partitions.append({alloc})\n"
           f"        {lhs} = self.partitions[0]")
    return text.replace(line, new, 1)


def mutates_an_input(text: str) -> str:
    """Right outputs, but scribbles on an input after computing them."""
    a = _first_arg(text)
    text = _after_clear(text, f"_kept = {a}")
    return _before_return(text, "_kept.mul_(0.5)")


def raises(text: str) -> str:
    return _after_clear(text, 'raise RuntimeError("candidate bug")')


def hangs(text: str) -> str:
    return _after_clear(text, "while True:\n    pass")


def segfaults(text: str) -> str:
    """Reads far outside an input's storage (an out-of-bounds shape assumption): SIGSEGV."""
    a = _first_arg(text)
    return _after_clear(text, f"reinterpret_tensor({a}, (1 << 36, ), (1, ), 0).sum()")


def raises_at_import(text: str) -> str:
    return text + '\nraise ImportError("candidate cannot load")\n'


def returns_hardcoded(text: str, captured_out) -> str:
    """Returns the captured output as a literal: right on the captured inputs only."""
    values = repr(captured_out.tolist())
    shape, stride = tuple(captured_out.shape), captured_out.stride()
    return _after_clear(text, f"return (torch.tensor({values}, dtype=torch.float32).as_strided({shape}, {stride}), )")


def skips_layer_norm_affine(text: str) -> str:
    """Assumes the LayerNorm weight is ones and bias zeros, as in the captured (fresh) model."""
    m = re.search(r"cpp_fused_native_layer_norm_0\((\w+), (\w+), (\w+), (\w+), ", text)
    assert m, "expected the inference example's layer norm kernel"
    w, b = m.group(3), m.group(4)
    return text.replace(m.group(0), m.group(0).replace(f", {w}, {b}, ",
                                                       f", torch.ones_like({w}), torch.zeros_like({b}), "), 1)


def addmm_in_bfloat16(text: str) -> str:
    """Runs the matmuls in bfloat16 and casts back: the precision downgrade."""
    rx = re.compile(r"extern_kernels\.addmm\((\w+), (\w+), (reinterpret_tensor\(\w+, \([^)]*\), \([^)]*\), \d+\)), "
                    r"alpha=1, beta=1, out=(\w+)\)")
    assert rx.search(text)
    return rx.sub(r"\4.copy_(torch.addmm(\1.bfloat16(), \2.bfloat16(), \3.bfloat16()).float())", text)


def mm_instead_of_loops(text: str) -> str:
    """The honest win for tests/fixtures/slow_matmul.py: an extern mm + tanh instead of scalar loops."""
    rx = re.compile(r"cpp_fused_mul_sum_tanh_unsqueeze_0\((\w+), (\w+), (\w+)\)")
    assert rx.search(text)
    return rx.sub(r"extern_kernels.mm(\2, \3, out=\1); torch.tanh(\1, out=\1)", text)


# Cheats the static screen must stop before anything runs: (code expected, source edit).
STATIC_CHEATS = {
    "side-thread": ("static-threads", "import threading\nthreading.Thread(target=lambda: None).start()"),
    "timer-patch": ("static-timing", "import time\ntime.perf_counter_ns = lambda: 0"),
    "torch-patch": ("static-patching", "torch.cuda.synchronize = lambda *a: None"),
    "env-read": ("static-environment", "_key = os.environ.get('OPENAI_API_KEY')"),
    "file-read": ("static-files", "_data = open('/etc/hostname').read()"),
    "abort": ("static-processes", "os.abort()"),
    "frames": ("static-frames", "import sys\n_caller = sys._getframe(1)"),
    "exec": ("static-dynamic-code", "exec('x = 1')"),
    "ctypes": ("static-native", "import ctypes\nctypes.CDLL(None)"),
    "module-cache": ("static-module-state", "_CACHE = {}\ndef _remember(k, v):\n    _CACHE[k] = v"),
    "global": ("static-module-state", "def _bump():\n    global _n\n    _n = 1"),
    "new-stream": ("static-streams", "_s = torch.cuda.Stream()"),
    "subprocess": ("static-processes", "import subprocess\nsubprocess.run(['true'])"),
}


def with_module_code(text: str, code: str) -> str:
    return text + "\n" + code + "\n"


def mm_accumulating_in_bfloat16(text: str, chunk: int = 16) -> str:
    """The bf16 matmul with partial sums rounded to bf16 every `chunk` of K: no fp32 accumulation."""
    rx = re.compile(r"^( *)extern_kernels\.mm\((\w+), (\w+), out=(\w+)\)$", re.M)
    assert rx.search(text), "expected an extern mm"

    def sub(m):
        ind, a, b, out = m.groups()
        return (f"{ind}{out}.zero_()\n{ind}for _k in range(0, {a}.shape[1], {chunk}):\n"
                f"{ind}    {out}.add_({a}[:, _k:_k + {chunk}] @ {b}[_k:_k + {chunk}])")
    return rx.sub(sub, text)


def with_redundant_work(text: str, reps: int) -> str:
    """The original plus `reps` sin() passes over its first tensor input into scratch: slower, same outputs."""
    a = _first_arg(text)
    return _after_clear(text, f"_waste = torch.empty_like({a})\nfor _ in range({reps}):\n    torch.sin({a}, out=_waste)")


def slowed_graph_copy(graph: Path, dest: Path, reps: int) -> Path:
    """A graph folder like `graph` whose wrapper is the slowed original: the original then is a real win."""
    import shutil

    out = dest / graph.name
    out.mkdir(parents=True)
    for f in ("graph.json", "data.pt"):
        shutil.copy(graph / f, out / f)
    (out / "wrapper.py").write_text(with_redundant_work((graph / "wrapper.py").read_text(), reps))
    return out


def decision_context(**fields):
    """A gate.context.DecisionContext for a test that drives one of the gate's steps directly: `fields` as given,
    placeholders for the rest (which that step does not read)."""
    from tilesmith.gate.context import DecisionContext, StageClock
    from tilesmith.gate.verdict import Policy

    placeholders = dict(gdir=Path("graph"), meta={}, cand=Path("candidate.py"), timing_base=None, timing_base_sha="",
                        scratch=Path("scratch"), device="cpu", policy=Policy(), mode="graph",
                        note=lambda stage, message: None, clock=StageClock({}), spares=None, modes={}, warnings=[],
                        specials={}, pair=(0, 1))
    return DecisionContext(**{**placeholders, **fields})
