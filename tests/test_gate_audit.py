"""The gate worker's audit hook (tilesmith/gate/worker/audit.py): what it refuses, how the refusal reaches the deciding
process, and that a candidate which swallows the refusal is still rejected. The hook cannot be removed once added,
so it is only ever installed in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests import gate_helpers as h
from tilesmith.gate import Policy, judge, static
from tilesmith.gate.worker import audit

ROOT = Path(__file__).resolve().parent.parent

_PROBE = r'''
import gc, json, socket, sys
from tilesmith.gate.worker import audit

ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)


def f():
    return 1


def g():
    return 2


def swap():
    f.__code__ = g.__code__


def fresh():
    return 3


audit.install(theirs.fileno(), audit.own_functions([sys.modules[__name__]]) - {id(fresh)})


def made_later():
    return 4


def library_habits():
    """What library code does all the time: named tuples (typing sets __new__.__defaults__), defaults of functions
    that are not the worker's (one made before the hook, one after)."""
    import collections, typing
    typing.NamedTuple("Span", [("lo", int), ("hi", int)])
    collections.namedtuple("Pair", "a b", defaults=(0,))
    fresh.__defaults__ = (1,)
    made_later.__code__ = g.__code__


tries = {"code": swap, "defaults": lambda: setattr(f, "__defaults__", (1,)),
         "kwdefaults": lambda: setattr(f, "__kwdefaults__", {}), "del defaults": lambda: delattr(f, "__defaults__"),
         "heap": gc.get_objects,
         "referrers": lambda: gc.get_referrers(f), "referents": lambda: gc.get_referents(f),
         "profile": lambda: sys.setprofile(None), "trace": lambda: sys.settrace(None),
         "hook": lambda: sys.addaudithook(lambda *a: None),
         # what honest code does and stays allowed: frames (logging, namedtuple), reading code, other attributes
         "frame": lambda: sys._getframe().f_back, "read code": lambda: f.__code__,
         "name": lambda: setattr(f, "__name__", "h"), "gc collect": gc.collect, "library habits": library_habits}
out = {}
for name, fn in tries.items():
    try:
        fn()
        out[name] = "allowed"
    except audit.Refused:
        out[name] = "refused"
ours.setblocking(False)
sent = []
while True:
    try:
        sent.append(ours.recv(200))
    except BlockingIOError:
        break
print(json.dumps({"out": out, "f": f(), "reported": audit.refusals(sent), "marks": len(sent)}))
'''


def test_the_audit_hook_refuses_swaps_of_protected_code_heap_walks_hooks_and_tracing_and_reports_each():
    p = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    refused = ["code", "defaults", "kwdefaults", "del defaults", "heap", "referrers", "referents", "profile", "trace"]
    assert r["out"] == {**{k: "refused" for k in refused}, "hook": "allowed",  # refusal suppressed by Python ...
                        "frame": "allowed", "read code": "allowed", "name": "allowed", "gc collect": "allowed",
                        "library habits": "allowed"}
    assert r["f"] == 1  # the swap never happened
    assert r["reported"] == ["object.__setattr__ __code__", "object.__setattr__ __defaults__",
                             "object.__setattr__ __kwdefaults__", "object.__delattr__ __defaults__", "gc.get_objects", "gc.get_referrers",
                             "gc.get_referents", "sys.setprofile", "sys.settrace",
                             "sys.addaudithook"]  # ... but reported: the second hook was not added
    assert audit.refusals([b"|", b"!gc.get_objects"]) == ["gc.get_objects"]  # window marks are not refusals


def test_a_candidate_that_swallows_the_refusal_is_still_rejected(inference_ws, tmp_path, monkeypatch):
    """The refusal's report goes to the deciding process on the mark socket, whatever the candidate does with the
    exception: otherwise honest code that tried a heap walk and caught the error would be judged as if it had not."""
    monkeypatch.setattr(static, "screen", lambda text: [])
    graph = h.graph_of(inference_ws)
    text = (graph / "wrapper.py").read_text()
    assert "\nclass Runner:" in text
    text = text.replace("\nclass Runner:", '''
import torch._dynamo.utils as _u

try:
    _u.gc.get_referrers(_u)
except Exception:
    pass

class Runner:''', 1)
    cand = tmp_path / "candidate.py"
    cand.write_text(text)
    v = judge(graph, cand, Policy(seed=0, time_budget_s=4.0))
    assert not v.accepted
    assert v.codes == ["process-state"] and v.stage == "load", v.reasons
    assert "gc.get_referrers" in v.reasons[0].message and "audit hook" in v.reasons[0].message

