"""The gate's honest corpus: real graphs of real models, Inductor's own wrappers and known-good candidates of
them, through the gate with the screen and every dynamic defence on. An honest original judged against itself
(A/A) must load, run and be found "not faster" (never a load, process-state, protocol or forged-timing failure);
a genuine win must be accepted. Every other outcome is a false rejection, and their rate is kept at 0.

Used by tests/test_gate_corpus.py (CPU-sized) and tests/gpu/test_corpus_gpu.py (GPU-sized). With
TILESMITH_CORPUS_OUT set, each decision is appended there as a JSON line (graph, case, outcome, codes, seconds).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from tests import gate_helpers
from tests.conftest import EXAMPLES, FIXTURES, run_capture_subprocess

MODEL = FIXTURES / "corpus_model.py"


@dataclass(frozen=True)
class Entry:
    name: str  # e.g. "gpt2-train"
    script: Path
    args: tuple = ()

    def __str__(self) -> str:
        return self.name


def entry(name: str, device: str, mode: str | None = None) -> Entry:
    """`gpt2`, `llama`, `resnet18`, `vit` (+ `-train`), `moe` / `inference` (the examples), or `step-sgd` /
    `step-adamw` (a training loop with BatchNorm and its optimizer step compiled: tests/fixtures/train_step.py), on
    `device`."""
    base, train = name.removesuffix("-train"), name.endswith("-train")
    tail = ("--device", device) + (("--mode", mode) if mode else ())
    if name.startswith("step-"):
        return Entry(name + (f"@{mode}" if mode else ""), FIXTURES / "train_step.py",
                     ("--optimizer", name.removeprefix("step-"), "--steps", "4") + tail)
    if base in ("moe", "inference"):
        return Entry(name + (f"@{mode}" if mode else ""), EXAMPLES / f"{base}.py", ("--steps", "2") + tail)
    return Entry(name + (f"@{mode}" if mode else ""), MODEL, ("--model", base) + (("--train",) if train else ()) + tail)


def capture(e: Entry, ws: Path) -> list[Path]:
    """Capture the entry's script into `ws`; its eligible graphs (at least one, or the capture failed)."""
    p = run_capture_subprocess(e.script, ws, *e.args, timeout=900)
    assert p.returncode == 0, f"{e}: capture failed\n{p.stderr[-4000:]}"
    return eligible(ws, p.stdout)


def eligible(ws: Path, said: str = "") -> list[Path]:
    """A captured workspace's eligible graphs (at least one)."""
    graphs = [g for g in sorted((ws / "graphs").iterdir())
              if json.loads((g / "graph.json").read_text()).get("eligible")]
    assert graphs, f"{ws}: no eligible graph\n{said[-2000:]}"
    return graphs


# Verdicts that say the candidate was run and measured, and found no faster: the only honest A/A outcome.
NOT_FASTER = {"not-faster"}


def false_rejection(v, case: str) -> str:
    """Why the verdict `v` for an honest candidate is a false rejection ("" when it is not)."""
    codes = set(v.codes)
    if case == "cheat":  # a red-team candidate: only its acceptance would be a problem (not a false rejection)
        return "a cheat was accepted" if v.accepted else ""
    if case == "aa":
        if v.accepted:
            return "the original was accepted as faster than itself"
        if v.stage in ("timing", "confirmation") and codes <= NOT_FASTER and codes:
            return ""
        return f"A/A ended at {v.stage}: " + "; ".join(f"{r.code}: {r.message[:200]}" for r in v.reasons)
    if v.accepted:
        return ""
    return f"a genuine win rejected at {v.stage}: " + "; ".join(f"{r.code}: {r.message[:200]}" for r in v.reasons)


def record(graph: Path, case: str, v, problem: str, seconds: float) -> None:
    out = os.environ.get("TILESMITH_CORPUS_OUT")
    if not out:
        return
    meta = json.loads((graph / "graph.json").read_text())
    row = {"graph": graph.name[:12], "kind": meta.get("kind"), "device": meta.get("device"),
           "compile_mode": meta.get("compile_mode"), "case": case, "accepted": v.accepted, "stage": v.stage,
           "codes": v.codes, "speedup": getattr(getattr(v.first, "timing", None), "speedup", None),
           "false_rejection": problem, "seconds": round(seconds, 1)}
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")


def judged(graph: Path, text: str, tmp: Path, case: str, **policy):
    """Judge `text` for `graph` with the screen and every defence on; (verdict, false-rejection reason)."""
    from tilesmith.gate import Policy, judge

    tmp.mkdir(parents=True, exist_ok=True)
    cand = tmp / f"{case}.py"
    cand.write_text(text)
    # A clear outcome stops sampling early (accepted, or futile); the budget only bounds a close call, which on a
    # loaded machine needs more samples (a 1.9x win read a lower bound of 0.83x after 6 s beside other test runs).
    # Up to three decisions, each recorded, as a user would run it again: where a genuine win was measured faster but
    # not beyond the noise (beside another suite a 1.7x win read a lower bound of 0.92x; a 1.5x win was not shown
    # twice in a row, the second time 0.77x), or the gate declined to decide, naming the machine (an A/A beside another suite: the original ran 10x its
    # time alone, twice).
    for _ in range(3):
        t0 = time.monotonic()
        v = judge(graph, cand, Policy(**{"time_budget_s": 12.0, **policy}))
        problem = false_rejection(v, case)
        record(graph, case, v, problem, time.monotonic() - t0)
        if not ((case == "win" and gate_helpers.not_shown(v)) or v.codes == ["unstable-timing"]):
            break
    return v, problem


def slowed_copy(graph: Path, dest: Path, times: int = 3) -> Path:
    """A graph folder like `graph` whose wrapper runs the whole original call `times` times (all but the last on
    copies of the inputs with their strides, which a backward's wrapper may reuse as scratch, and with the random generators put back): its original is a genuine win there,
    whatever the graph's size (redundant kernels of a fixed size made a tiny graph's win 27x in one pass and 119x in
    the other, which the gate rightly calls irreproducible)."""
    out = dest / graph.name
    out.mkdir(parents=True)
    for f in graph.iterdir():
        if f.is_file() and f.name != "wrapper.py":
            shutil.copy(f, out / f.name)
    # The extra calls leave the random generators as they found them: a training forward's dropout draws its masks
    # from them, and the last call must draw what the original's one call does (not inside a CUDA graph's capture,
    # where the generator's state is the graph's own).
    again = (f"\n\n_call_once = call\n\n\ndef _slowed_copy_of(a):\n"
             "    if not isinstance(a, torch.Tensor):\n"
             "        return a\n"
             "    try:  # the same strides (a view with gaps, e.g. one of q/k/v, keeps them: the wrapper asserts them)\n"
             "        return torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device).copy_(a)\n"
             "    except RuntimeError:  # overlapping memory (a zero stride)\n"
             "        return a.clone()\n"
             "\n\ndef call(args):\n"
             "    _rng = [torch.get_rng_state()]\n"
             "    if torch.cuda.is_available() and not torch.cuda.is_current_stream_capturing():\n"
             "        _rng.append(torch.cuda.get_rng_state())\n"
             f"    for _ in range({times - 1}):\n"
             "        _call_once([_slowed_copy_of(a) for a in args])\n"
             "    torch.set_rng_state(_rng[0])\n"
             "    if len(_rng) > 1:\n"
             "        torch.cuda.set_rng_state(_rng[1])\n"
             "    return _call_once(args)\n")
    (out / "wrapper.py").write_text((graph / "wrapper.py").read_text().rstrip("\n") + again)
    return out


_CALL_START = re.compile(r"^( +)args\.clear\(\)\n", re.M)


def at_call_start(text: str, code: str) -> str:
    """`code` inserted right after call(args) unpacks and clears its arguments (Inductor's wrappers all do)."""
    m = _CALL_START.search(text)
    assert m, "expected Inductor's `args.clear()` in call(args)"
    body = "".join(f"{m.group(1)}{line}\n" for line in code.strip("\n").splitlines())
    return text[:m.end()] + body + text[m.end():]


def makes_a_namedtuple_at_first_call(text: str) -> str:
    """The original, plus what library code does all the time: a typing.NamedTuple made inside a call (typing
    sets the new class's __new__.__defaults__), as torch 2.11's _is_non_overlapping_and_dense_or_false does."""
    return at_call_start(text, "import typing\n_Span = typing.NamedTuple('_Span', [('lo', int), ('hi', int)])\n"
                               "_span = _Span(0, 1)")


def imports_a_module_lazily(text: str) -> str:
    """The original, plus a torch module imported at its first call that makes named tuples as it is imported
    (torch.nn.attention.flex_attention, as Inductor's own code imports pieces lazily)."""
    return at_call_start(text, "from torch.nn.attention import flex_attention as _flex_attention")
