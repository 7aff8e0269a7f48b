"""The gate worker's checks (requests `original_checks` and `checks`; serve.py runs them, and `_patched` after every
request): the original's outputs on exactly the inputs of the candidate's kept timed calls, the kept outputs of timed
calls handed to the parent, and what candidate code replaced in the namespaces watched since before it ran.
"""

from __future__ import annotations

import os

import torch

from tilesmith.gate.worker import patches
from tilesmith.gate.worker.outputs import _call
from tilesmith.gate.worker.sample import _keep_pending, _set_content
from tilesmith.gate.worker.setup import _updated
from tilesmith.gate.worker.state import State
from tilesmith.gate.worker.tensors import _as_list, _to_cpu


def op_original_checks(st: State, req: dict) -> dict:
    """The original (role baseline) on exactly the inputs of the candidate's kept timed calls: for each
    sample (fill, perturb seed, start) and each kept call, the buffer that call read, rebuilt."""
    role, n = req["bufs_role"], len(st.bufs[req["bufs_role"]])
    updated = _updated(st)
    results = []
    for sample in req["samples"]:
        if set(updated) & st.shared:
            results.append(_sample_replayed(st, role, n, sample, updated, bool(req.get("late"))))
            continue
        outs = []
        for call in sample["calls"]:
            b = (sample["start"] + call) % n
            bufs = st.bufs[role][b]
            _set_content(st, bufs, st.pool[role][sample["fill"][b]], sample["perturb"], b)
            _, res = _call(st, "baseline", bufs, False)
            outs.append(res + [_to_cpu(bufs[i]) for i in updated])
        results.append(outs)
    torch.save(results, req["out_file"])
    return {}


def _sample_replayed(st: State, role: str, n: int, sample: dict, updated: list, late: bool) -> list:
    """The original's outputs at a sample's kept calls where a parameter it updates in place (one buffer for every
    set: a program's running statistics or optimizer state stay at one address) carries state from each call to the
    next: every buffer set refilled as before the sample, then the sample's calls in order up to its last kept one.
    late: read as the candidate's worker read them in launch timing, where a kept call's outputs are held, not
    copied, until the sample ends (a copy inside the window would cost the candidate alone: an A/A read 0.66-0.74x
    on the H100): what such a call returns or updates that a later call of the sample updated again is read as the
    last call left it, here as there."""
    for b, c in enumerate(sample["fill"]):
        _set_content(st, st.bufs[role][b], st.pool[role][c], sample["perturb"], b)
    want, got = set(sample["calls"]), {}
    for i in range(max(want) + 1):
        bufs = st.bufs[role][(sample["start"] + i) % n]
        out, res = _call(st, "baseline", bufs, False)
        if i in want:
            got[i] = (_as_list(out) + [bufs[j] for j in updated]) if late else res + [_to_cpu(bufs[j]) for j in updated]
        del out
    if late:
        got = {i: [_to_cpu(o) for o in outs] for i, outs in got.items()}
    return [got[c] for c in sample["calls"]]


def op_checks(st: State, req: dict) -> dict:
    """The kept outputs of timed calls (the pending sample's too when `keep`), saved raw for the parent."""
    if req.get("keep"):
        _keep_pending(st)
    checks = [torch.load(f, weights_only=True) for f in st.checks]
    torch.save(checks, req["out_file"])
    for f in st.checks:
        os.remove(f)
    n, st.checks = len(checks), []
    return {"n": n}


def _patched(st: State) -> str:
    if st.patch0 is None:
        return ""
    names = patches.replaced(st.patch0, st.watched)
    return ("it replaces " + ", ".join(names) + " (code that runs after it in this process would call the "
            "replacement)") if names else ""
