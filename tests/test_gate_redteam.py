"""The gate's second line against its own red team (tests/redteam.py): every cheat passes the static
screen (asserted), and is then judged with the screen switched off, so that only the dynamic defences
act: outputs checked inside the timed stream, the original timed in its own worker, the process-state
fingerprint, fresh input values every round, and the OS sandbox."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests import gate_helpers as h
from tests import redteam
from tilesmith.launch import sandbox, secrets
from tilesmith.gate import Policy, judge, static

KEY = "sk-redteam-" + "7" * 24
_SCREEN = static.screen  # bound at import, before any fixture switches it off


@pytest.fixture(scope="module")
def inf_graph(inference_ws) -> Path:
    return h.graph_of(inference_ws)


@pytest.fixture
def screen_off(monkeypatch):
    monkeypatch.setattr(static, "screen", lambda text: [])  # judge() looks it up at each call


def _judge(graph: Path, text: str, tmp_path: Path, **kw):
    assert static.screen.__name__ == "<lambda>"  # the screen is off: only the dynamic defences act
    cand = tmp_path / "candidate.py"
    cand.write_text(text)
    # Judged once more where the machine was too busy to time it (CI saw it once, the other test process loading
    # both cores).
    return h.settled(lambda: judge(graph, cand, Policy(**{"seed": 0, "time_budget_s": 4.0, **kw})))


CHEATS = [
    (redteam.stale_after_n_on_the_runner, "wrong-values-in-timing", "timing"),
    (redteam.stale_after_n_in_a_closure, "wrong-values-in-timing", "timing"),
    (redteam.degrades_every_kth_call, "wrong-values-in-timing", "timing"),
    (redteam.starves_what_runs_after_it, "process-state", "correctness"),
    (redteam.slows_the_library_the_original_calls, "process-state", "load"),
    (redteam.swaps_the_originals_kernels, "process-state", "load"),
    # Its thread starts at import and spins at once: whether the fingerprint taken after the load sees it
    # running or the one after the first correctness call does is a race; either rejects, for this reason.
    (redteam.hogs_the_cores_from_a_raw_thread, "process-state", ("load", "correctness")),
    (redteam.hogs_the_cores_from_a_forked_process, "background-work", "timing"),
    (redteam.hogs_the_cores_from_torchscripts_pool, "background-work", "timing"),
    # The numbers a worker reports are the only ones in the deciding process: the encoder they go out through is
    # watched like the clock that makes them (before, this cheat's A/A was accepted at 1.6x).
    (redteam.reports_a_shorter_time, "process-state", "load"),
    (redteam.defers_its_work_to_lazy_outputs, "output-type", "timing"),
    # The worker's own code and state, checked from its main loop's frame (gate/worker/guard.py).
    (redteam.encoder_instance_encode, "not-faster", "timing"),
    (redteam.ops_dict_entry, "process-state", "load"),
    (redteam.clock_code_swap, "process-state", "load"),
    # Found the reply pipe's file object through the garbage collector; since session 20 the worker's audit hook
    # refuses the heap walk at load (before, with os.write replies, it found nothing to patch: "not-faster").
    (redteam.pipe_write_instance, "process-state", "load"),
    (redteam.disables_the_watch, "process-state", "load"),
    # A window's end read the clock through a global after candidate code ran: a fake that put the real one back
    # as it answered left nothing for the guard to find (accepted at 1.61x, low 1.52x, confirmed). The window now
    # reads a clock bound before any candidate call of the request; the fake is never read, and the guard finds it.
    (redteam.restores_its_patch_before_the_check, "process-state", "timing"),
    # The window's start moved in the running frame through ctypes (accepted at 1.44x, low 1.40x, confirmed): no
    # state the guard records changes. The parent's own clock times each window (the kernel's timestamps of the
    # worker's marks, gate/windows.py) and never reads the worker's number: the cheat is the original again.
    (redteam.moves_the_clocks_start_in_its_frame, "not-faster", "timing"),
    # The plain-tensor check reached through a closure cell and blinded (accepted at 41x, low 7.0x): the window's
    # checks now live in the worker frame's locals.
    (redteam.blinds_the_type_check, "output-type", "timing"),
    # Plain outputs never computed, filled with the real values by a `Tensor.detach` that the digest of the kept
    # outputs called and that put itself back (accepted at 27.6x, low 22.6x): the digest now calls torch's C
    # methods bound before candidate code, so the fake is never called, stays, and the guard finds it.
    (redteam.fills_its_outputs_when_checked, "process-state", "timing"),
]

# A helper's red team, session 19 (each was accepted, confirmed in the second pass, before the change noted; measured
# on the 2-core VM).
NEW_CHEATS = [
    # A tuple subclass: the window type-checked only inside exact lists and tuples, and snapshot's list(out) ran its
    # __iter__: only the reservoir's kept call and the last call were computed (accepted at 2.87x, low 2.38x;
    # confirmed 2.76x). The window now requires an exact tuple or list (or a lone plain tensor).
    (redteam.computes_only_what_is_read, "output-type", "timing"),
    # The request's fill and perturb seed read from op_time's frame in the untimed warm-up calls, every timed call's
    # outputs computed there, off the clock (25.6x, low 22.5x; confirmed 21.2x). The warm-up is now a request of its
    # own (worker.op_warm), sent before the sample's values exist: the cheat finds none and is the original again.
    (redteam.precomputes_the_sample_in_its_untimed_calls, "not-faster", "timing"),
    # Its answer to that: a profile function set in a warm-up call runs at the worker's decoding of the sample's
    # request and computes the outputs there: its windows timed 16x faster than the original's. The worker refuses
    # to end a request with a profile or trace function set (and its audit hook refuses to set one); before it did,
    # the span from request to window was compared with the original's (its windows opened 1.8-4.5 ms later), and
    # the parent no longer compares that span (gate/windows.py says what keeps candidate code out of it).
    (redteam.precomputes_from_a_profile_hook, "process-state", "timing"),
    # A profile function set in every timed call that computes, after the window, the last call's outputs (and, at
    # the reservoir's snapshot, the kept call's). Session 19: the worker cleared it after each call, so the outputs
    # stayed uncomputed ("wrong-values-in-timing"); since session 20 the worker's audit hook refuses to set it.
    # Without either, its outputs were digested 0.65 ms later after the window than the original's were (a check of
    # that span, tried, also rejected honest work: the two processes' allocations differ).
    (redteam.fills_its_outputs_from_a_profile_hook, "process-state", "timing"),
    # A Python kernel for aten::detach (torch.library), called by the digest's bound C methods after the window
    # (28.9x, low 24.8x; confirmed 24.2x). The worker guard now records the kernels behind the worker's own ops.
    (redteam.fills_its_outputs_through_the_dispatcher, "process-state", "load"),
    # The same kernel, registered by the timed instance's calls and removed by itself after the window's last call
    # (42.2x, low 28.1x; confirmed 29.5x): found by the check after time_setup (it registered in the warm-up calls),
    # and by the checks before the refill and after the window's calls where it would register only there.
    (redteam.fills_through_the_dispatcher_only_while_timed, "process-state", "timing"),
    # A Python kernel for aten::copy_ registered in a warm-up call runs in the sample's refill, after its values
    # arrived and before its window, computes every timed call's outputs there and removes itself: the dispatcher's
    # table was compared only after the window and after the request, where it was as recorded again.
    (redteam.precomputes_the_sample_in_the_refill, "process-state", "timing"),
]


# Session 20: what the worker's audit hook (tilesmith/gate/worker/audit.py) refuses, by cheats that need it.
AUDIT_CHEATS = [
    # The worker's own `snapshot` given, in place, code that computes the outputs it is handed and puts the original
    # back: only the reservoir's kept call and the last call are computed. Accepted with the audit hook switched off
    # (the worker guard compares code after the request, when the original is back): see RESULTS.md, session 20.
    (redteam.swaps_the_snapshots_code_and_puts_it_back, "process-state", "timing"),
    # A helper's red team against the hook (session 20) went around it: no code replaced, Python the worker ran
    # between the window's end and the digest redirected through a module attribute and a class attribute, each put
    # back (accepted at 15.3x and 13.0x, confirmed). That span now runs only C functions and locals bound before.
    (redteam.fills_its_outputs_from_the_grad_mode_exit, "process-state", "timing"),  # its replacement stays set
    (redteam.fills_its_outputs_from_the_states_setattr, "protocol", "timing"),  # filled after the digest
]

# Issue 35: what only the kernel can refuse once the candidate has loaded (gate/worker/seccomp.py).
KERNEL_CHEATS = [
    # A SIGALRM handler installed and armed in the first timed call fills the kept and last outputs after the window
    # and removes itself before the request ends (accepted 4 of 4 at 20-55x before the filter): the call that asks
    # for the handler raises now.
    (redteam.fills_its_outputs_from_a_signal_handler, "raised", "timing"),
]


def _maker(case):
    return (case.values if hasattr(case, "values") else case)[0]  # a pytest.param or a plain tuple


def test_every_red_team_cheat_passes_the_static_screen(inf_graph, tmp_path):
    text = (inf_graph / "wrapper.py").read_text()
    made = [m(text) for m, _, _ in CHEATS] + [_maker(c)(text) for c in NEW_CHEATS + AUDIT_CHEATS] + [redteam.remembers_outputs_by_input_content(text),
                                              redteam.remembers_outputs_by_address_and_first_value(text),
                                              redteam.escapes(text, "/tmp", "/x", "/y", "http://127.0.0.1:9/")]
    assert [static.screen(t) for t in made] == [[]] * len(made)


@pytest.mark.parametrize("maker,code,stage", CHEATS, ids=[m.__name__ for m, _, _ in CHEATS])
def test_gate_rejects_a_cheat_the_screen_missed_for_the_right_reason(inf_graph, tmp_path, screen_off, monkeypatch,
                                                                     maker, code, stage):
    # Workers start with two threads here, so a call that leaves the process with one changes its state. Except
    # where the cheat ends as the original again, judged "not faster" only by timing it whole: two OpenMP threads
    # pinned to both cores of a 2-core box beside the other test process ran the original 10x slower beside the
    # candidate than alone, and the gate rightly said `unstable-timing` (in two of three fresh-clone suite runs).
    monkeypatch.setenv("OMP_NUM_THREADS", "1" if code == "not-faster" else "2")
    v = _judge(inf_graph, maker((inf_graph / "wrapper.py").read_text()), tmp_path)
    for _ in range(2):
        # A cheat caught by the checks of its timed calls can first read clearly slower on a loaded machine, and a pass
        # that ends at its first look checks few calls: beside another test suite, `degrades_every_kth_call` (zeros
        # every third call) read 0.43x and none of its checked calls was a zero one. Rejected all the same; judged
        # again, up to three decisions, for the reason this test is about.
        if code in ("not-faster", "unstable-timing") or not h.timing_only(v):
            break
        v = _judge(inf_graph, maker((inf_graph / "wrapper.py").read_text()), tmp_path)
    assert not v.accepted
    if maker is redteam.degrades_every_kth_call and v.codes == ["not-faster"] and _clearly_slower(v):
        # Its zero calls are the ones its call counter puts there; where the gate's cycle of warm-up and timed calls
        # is a multiple of k, the timed calls are never those, and the cheat is then not faster either (its gain is on
        # untimed calls). Beside another suite a sample's size came out so three decisions in a row (one suite run
        # of five): rejected, as it must be, for that.
        return
    assert v.codes == [code] and v.stage in ((stage,) if isinstance(stage, str) else stage), v.reasons


def _clearly_slower(v) -> bool:
    """A verdict whose timing found the candidate clearly not faster beside the original (its upper bound under the
    bar), not merely unshown."""
    t = v.first.timing if v.first else None
    return bool(t) and any("clearly not faster" in r.message for r in v.reasons) and t.beside_speedup < 1.0


@pytest.mark.parametrize("maker,code,stage", NEW_CHEATS + AUDIT_CHEATS + KERNEL_CHEATS,
                         ids=[_maker(c).__name__ for c in NEW_CHEATS + AUDIT_CHEATS + KERNEL_CHEATS])
def test_gate_rejects_a_new_cheat_the_screen_missed(inf_graph, tmp_path, screen_off, monkeypatch, maker, code, stage):
    """The later red teams' cheats, each judged as the ones above (the screen has nothing to flag: asserted first)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1" if code == "not-faster" else "2")  # as above
    text = maker((inf_graph / "wrapper.py").read_text())
    assert _SCREEN(text) == []  # the real screen (the fixture has switched it off for judge)
    v = _judge(inf_graph, text, tmp_path)
    assert not v.accepted, (v.first.timing, v.confirmation and v.confirmation.timing)
    assert v.codes == [code] and v.stage == stage, v.reasons


def test_code_that_misbehaves_only_with_the_captured_weights_is_caught_by_the_set_that_has_them(
        inf_graph, tmp_path, screen_off):
    """A program's later calls run the captured weights with new inputs; no other correctness set and no
    timed call has that combination, so code keyed on the exact weights would misbehave only in the program."""
    import re

    import torch

    from tilesmith.capture import loading

    text = (inf_graph / "wrapper.py").read_text()
    names = re.search(r"^        (\w+(?:, \w+)*) = args$", text, re.M).group(1).split(", ")
    data = loading.load_graph_data(inf_graph, device_map="cpu")
    infos = data.meta["inputs"]
    w = next(i for i, m in enumerate(infos) if m.get("parameter") and data.inputs[i].numel() >= 8)
    a = next(i for i, m in enumerate(infos) if not m.get("parameter") and isinstance(data.inputs[i], torch.Tensor))
    head = lambda t: t.flatten()[:8].tolist()  # noqa: E731
    cheat = redteam.misbehaves_only_with_the_captured_weights(
        text, names[w], head(data.inputs[w]), names[a], head(data.inputs[a]), float(data.inputs[a].abs().max()))
    assert static.screen(cheat) == []  # nothing for the screen to see
    v = _judge(inf_graph, cheat, tmp_path)
    assert not v.accepted and v.stage == "correctness" and v.codes == ["wrong-values"], v.reasons
    assert "captured-weights" in v.reasons[0].message
    failed = [c.name for c in v.first.correctness if not c.ok]
    assert failed == ["captured-weights"], failed


def test_a_cache_keyed_on_input_values_gains_nothing_because_every_timed_call_sees_new_values(
        inf_graph, tmp_path, screen_off, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    v = _judge(inf_graph, redteam.remembers_outputs_by_input_content((inf_graph / "wrapper.py").read_text()), tmp_path,
               confirm=False)
    # Either it computed every call (and gains nothing), or a value it remembered came back wrong for the
    # new inputs and the in-timing check caught it: rejected both ways.
    assert not v.accepted and v.codes in (["not-faster"], ["wrong-values-in-timing"]), v.reasons
    t = v.first.timing
    # Its timed calls were checked: computed every call and right, or checked until one came back wrong (its key,
    # a sum of sums, sometimes matches for different inputs: about one pass in eight).
    assert t.checked_calls >= (1 if v.codes == ["wrong-values-in-timing"] else 2), (v.codes, t)


@pytest.fixture(scope="module")
def ids_graph(tmp_path_factory, inductor_cache) -> Path:
    from tests.conftest import FIXTURES, captured_workspace

    return h.graph_of(captured_workspace(tmp_path_factory, "ws-token-ids", FIXTURES / "token_ids.py"))


def test_a_cache_keyed_on_addresses_gains_nothing_because_no_sample_reads_a_buffer_twice(
        inf_graph, tmp_path, screen_off, monkeypatch):
    """Samples of 100 ms (the example's graph runs ~0.25 ms per call here): before the gate capped a
    sample's calls at its buffer sets, such a sample read each of 64 buffers six times, this cache
    answered the later laps from memory, right on every checked call, and was accepted at 3.25x."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cheat = redteam.remembers_outputs_by_address_and_first_value((inf_graph / "wrapper.py").read_text())
    v = _judge(inf_graph, cheat, tmp_path, confirm=False, target_sample_ms=100.0)
    assert not v.accepted and v.codes in (["not-faster"], ["wrong-values-in-timing"]), v.reasons
    t = v.first.timing
    assert t.calls_per_sample <= t.buffer_sets and t.buffer_sets >= 4, t


def test_a_cache_keyed_on_token_ids_gains_nothing_because_every_sample_draws_new_ids(
        ids_graph, tmp_path, screen_off, monkeypatch):
    """The graph's one moving input is integer ids. Before they were drawn afresh for every sample, the
    timed calls cycled through eight pool contents, the cache answered nearly every call from memory
    (right on all 44 checked ones), and was accepted at 13.5x."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    meta = json.loads((ids_graph / "graph.json").read_text())
    assert [d["dtype"] for d in meta["inputs"] if not d.get("parameter")] == ["int64"], meta["inputs"]
    cheat = redteam.remembers_outputs_by_address_and_first_value((ids_graph / "wrapper.py").read_text())
    v = _judge(ids_graph, cheat, tmp_path, confirm=False)
    assert not v.accepted and v.codes in (["not-faster"], ["wrong-values-in-timing"]), v.reasons
    assert v.first.timing.checked_calls >= 2


class _Hits(http.server.BaseHTTPRequestHandler):
    hits: list = []

    def do_GET(self):
        _Hits.hits.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"exfiltrated")

    def log_message(self, *a):
        pass


@pytest.mark.skipif(sandbox.level() != "namespaces", reason="needs user namespaces (the env-only level cannot "
                                                                 "stop file and network access)")
def test_sandboxed_candidate_cannot_read_secrets_or_the_workspace_write_outside_scratch_or_reach_the_network(
        inf_graph, tmp_path):
    """Judged in a deciding process started with the provider key in its environment, as a user's
    shell would start it: the candidate reads /proc/<parent>/environ, a secret file, the workspace's
    metadata, writes what it got next to the test, and downloads from a server on the host's loopback."""
    leak = tmp_path / "leak"
    leak.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text(KEY)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hits)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/steal"
    cand = tmp_path / "escape.py"
    cand.write_text(redteam.escapes((inf_graph / "wrapper.py").read_text(), str(leak), str(secret),
                                    str(inf_graph.parent.parent / "workspace.toml"), url))
    code = ("import sys; from tilesmith.gate import Policy, judge, static; static.screen = lambda text: []; "
            "v = judge(sys.argv[1], sys.argv[2], Policy(time_budget_s=1.0, confirm=False)); "
            "print(v.sandbox, v.stage, ','.join(v.codes))")
    try:
        p = subprocess.run([sys.executable, "-c", code, str(inf_graph), str(cand)], capture_output=True, text=True,
                           timeout=600, env={**os.environ, "OPENAI_API_KEY": KEY, "OMP_NUM_THREADS": "1"})
    finally:
        server.shutdown()
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[:2] == ["namespaces", "timing"], p.stdout  # it ran (and was timed) in the sandbox
    assert list(leak.iterdir()) == [] and _Hits.hits == []
    assert KEY not in p.stdout + p.stderr


def test_sandbox_level_can_be_forced_to_env_only_and_a_bad_setting_is_a_usage_error(monkeypatch, tmp_path):
    from tilesmith.errors import TilesmithError

    monkeypatch.setenv("TILESMITH_SANDBOX", "off")
    assert sandbox.level() == "env-only"
    assert sandbox.wrap(["true"], sandbox.Spec(scratch=str(tmp_path))) == ["true"]  # the command runs as it is
    monkeypatch.setenv("TILESMITH_SANDBOX", "sometimes")
    with pytest.raises(TilesmithError, match="TILESMITH_SANDBOX") as e:
        sandbox.level()
    assert e.value.code == "usage"
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert secrets.redact(f"key={KEY}.") == "key=[REDACTED]." and secrets.redact_obj({"a": [KEY]}) == {"a": ["[REDACTED]"]}
