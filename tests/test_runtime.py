"""The runtime, end to end, in fresh processes with real Inductor on CPU.

Most tests install artifacts through the store API directly, bypassing the gate on purpose: they are
Inductor's own captured wrappers plus a marker line (and, where a test says so, an output
perturbation), so that *which code ran* is visible in the program's behaviour. The gate would (rightly)
reject such artifacts. The one test that goes through submit -> gate -> install uses a genuinely
faster wrapper (tests/fixtures/slow_pointwise.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import gate_helpers as h
from tests.conftest import EXAMPLES, captured_workspace, run_capture_subprocess
from tilesmith import store
from tilesmith.runtime import NOTICE
from tilesmith.workspace import load as load_ws

FIXTURES = Path(__file__).parent / "fixtures"
DRIVER = FIXTURES / "with_runtime.py"
SLOW = FIXTURES / "slow_pointwise.py"


# -- helpers ---------------------------------------------------------------------------------------
def run(script: Path, *args: str, cache: Path, runtime: bool = True, env: dict | None = None, timeout: int = 600):
    """Run `script` in a fresh interpreter on Inductor cache `cache`; with the runtime imported when asked."""
    cmd = [sys.executable, str(DRIVER), str(script), *args] if runtime else [sys.executable, str(script), *args]
    e = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    e.pop("TILESMITH_RUNTIME_STRICT", None)
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)


def stats_of(p) -> dict:
    lines = [line for line in p.stdout.splitlines() if line.startswith("TILESMITH_STATS ")]
    assert lines, p.stdout + p.stderr
    return json.loads(lines[-1].split(" ", 1)[1])


def number(p, label: str) -> float:
    m = re.search(rf"{label} (-?[\d.]+(?:e[-+]?\d+)?)", p.stdout)
    assert m, p.stdout + p.stderr
    return float(m.group(1))


def marker_artifact(wrapper_text: str, key: str, perturb: bool = False) -> bytes:
    """Inductor's captured wrapper plus a marker appended on every call; `perturb` adds 1000 to the output."""
    text = wrapper_text.replace("\nimport torch\n", "\nimport torch\nimport builtins as _tilesmith_b\n", 1)
    marker = rf"\1args.clear()\n\1_tilesmith_b.__dict__.setdefault('tilesmith_test_hits', []).append('{key[:12]}')"
    text, n = re.subn(r"^(\s*)args\.clear\(\)$", marker, text, count=1, flags=re.M)
    assert n == 1 and "_tilesmith_b" in text
    if perturb:
        text, n = re.subn(r"^(\s*)return \((\w+), \)$", r"\1\2.add_(1000.0)\n\1return (\2, )", text, count=1, flags=re.M)
        assert n == 1
    return text.encode()


def install_direct(ws: Path, key: str, data: bytes, environment: dict | None = None, force: bool = False) -> None:
    """Install `data` for `key`, gate bypassed; force: over an artifact already there (the store keeps the one
    with evidence as good, and every artifact installed here has the same evidence)."""
    meta = json.loads((ws / "graphs" / key / "graph.json").read_text())
    r = store.put(key, data, kind=meta["kind"], environment=environment or meta["environment"],
                  evidence=store.Evidence(2.0, 1.5, 2.5, "launch", 10), provenance={"optimizer": "test (gate bypassed)"},
                  force=force)
    assert r.action in ("installed", "replaced") or (r.action == "kept" and r.manifest.sha256 == store.sha256_bytes(data)), r


def keys(ws: Path) -> list[str]:
    return sorted(g.key for g in load_ws(ws).graphs)


def warnings_in(p) -> list[str]:
    """The runtime's warnings on stderr (not its exit line: notice_in)."""
    return [line for line in p.stderr.splitlines() if line.startswith("tilesmith: ") and not line.startswith(NOTICE)]


def notice_in(p) -> list[str]:
    """The runtime's one line at exit, saying what it substituted."""
    return [line for line in p.stderr.splitlines() if line.startswith(NOTICE)]


# -- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def pointwise_ws(tmp_path_factory, inductor_cache):
    """slow_pointwise.py captured twice, --slow and not, side by side (two compiles of different kernels,
    nothing timed): (slow workspace, fast workspace)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        slow = pool.submit(captured_workspace, tmp_path_factory, "ws-slow", SLOW, "--slow")
        fast = pool.submit(captured_workspace, tmp_path_factory, "ws-fast", SLOW)
        return slow.result(), fast.result()


@pytest.fixture(scope="session")
def slow_ws(pointwise_ws):
    return pointwise_ws[0]


@pytest.fixture(scope="session")
def fast_ws(pointwise_ws):
    return pointwise_ws[1]


@pytest.fixture(scope="module")
def inference_baseline(inference_ws, inductor_cache):
    """The session's Inductor cache (warm: the capture compiled the example into it) and the checksum
    the example prints there without tilesmith."""
    cache = inductor_cache
    p = run(EXAMPLES / "inference.py", "--steps", "2", cache=cache, runtime=False)
    assert p.returncode == 0, p.stderr
    return cache, number(p, "checksum")


# -- tests -----------------------------------------------------------------------------------------
def test_import_tilesmith_runtime_registers_lazily_and_loads_no_inductor_or_cli_modules():
    code = ("import sys, tilesmith.runtime as r; from tilesmith.runtime import hook; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'typer', 'rich', 'langchain', "
            "'deepagents', 'tilesmith_cli')]; "
            "print(bad, hook.is_patched(), r._handle in hook.handlers()); "
            "import torch._inductor.output_code as oc; print(hook.is_patched(), oc.CompiledFxGraph.post_compile._tilesmith)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["[] False True", "True True"]


def test_gate_accepted_faster_candidate_is_installed_and_runs_on_cold_and_warm_inductor_caches(
        tmp_path, slow_ws, fast_ws):
    from tilesmith.gate.verdict import Policy
    from tilesmith.install import install
    from tilesmith.submit import submit

    (slow_key,), (fast_key,) = keys(slow_ws), keys(fast_ws)
    assert slow_key != fast_key  # two different wrappers of the same graph
    # 16 s of timing: the original is memory-bound over 16 MB buffers, and with the other test worker loading the
    # VM's memory its samples ranged 13-84 ms in one run; 7 samples in 8 s then left the lower bound at 0 (a 3-11x
    # win rejected as not shown to be faster, twice in full suites on session 20's code; 12 samples alone).
    # And once more where it was measured faster but not shown beyond the noise (gate_helpers.shown): with another
    # suite beside this one a 2.1x win read a 0.95x lower bound in 16 s.
    result = h.shown(lambda: submit(slow_ws / "graphs" / slow_key, fast_ws / "graphs" / fast_key / "wrapper.py",
                                    Policy(time_budget_s=16.0)))
    assert result.accepted, result.verdict["reasons"]
    installed = install(result.run_id)
    assert [(g.key, g.status) for g in installed.graphs] == [(slow_key, "installed")]
    assert store.artifact_path(slow_key).read_bytes() == (fast_ws / "graphs" / fast_key / "wrapper.py").read_bytes()

    cache = tmp_path / "cache"
    cold = run(SLOW, "--slow", cache=cache)
    warm = run(SLOW, "--slow", cache=cache)
    for p in (cold, warm):
        assert p.returncode == 0, p.stderr
        s = stats_of(p)
        assert (s["graphs_seen"], s["substituted"], s["fallbacks"]) == (1, 1, [])
        assert s["substituted_keys"] == [slow_key]
        assert number(p, "max_err") < 1e-5  # the script compares with eager PyTorch


def test_every_training_graph_is_substituted_on_cold_and_warm_caches_with_the_same_loss(tmp_path, training_ws):
    ks = keys(training_ws)
    assert len(ks) == 4  # fw and bw on both sides of the graph break
    for k in ks:
        install_direct(training_ws, k, marker_artifact((training_ws / "graphs" / k / "wrapper.py").read_text(), k))
    from concurrent.futures import ThreadPoolExecutor

    cache = tmp_path / "cache"
    cold = run(EXAMPLES / "training.py", "--steps", "2", cache=cache)
    # Then two processes on the cache the cold run filled, side by side (nothing here is timed, and each
    # mostly imports torch: two at a time use both cores of a small CI box).
    with ThreadPoolExecutor(max_workers=2) as pool:
        warm = pool.submit(run, EXAMPLES / "training.py", "--steps", "2", cache=cache)  # FX- and AOTAutograd-cache hits
        plain = pool.submit(run, EXAMPLES / "training.py", "--steps", "2", cache=cache, runtime=False)
        warm, plain = warm.result(), plain.result()
    for p in (cold, warm):
        assert p.returncode == 0, p.stderr
        s = stats_of(p)
        assert (s["graphs_seen"], s["substituted"], s["fallbacks"]) == (4, 4, [])
        assert sorted(s["substituted_keys"]) == ks
        assert sorted(set(s["marker_hits"])) == sorted(k[:12] for k in ks)  # the artifacts' code ran
        assert len(s["marker_hits"]) == 8  # 4 graphs x 2 steps
        assert number(p, "loss") == number(plain, "loss")
    assert plain.returncode == 0 and "TILESMITH_STATS" not in plain.stdout


def test_code_that_recognises_the_gates_sandbox_passes_its_checks_and_verify_catches_it_in_the_program(
        tmp_path, inference_ws, inference_baseline, monkeypatch):
    """The limit docs/gate.md states, shown: a wrapper that is right only where its process id is small (the
    gate's PID namespace) is stopped by the allowlist before anything runs (it reaches `os` through a torch
    module); with the static stage off it passes every correctness set and every checked timed call (rejected only
    as not faster: it does the original's work); in the program, TILESMITH_VERIFY catches it on the first call."""
    from tests import redteam
    from tilesmith.launch import sandbox
    from tilesmith.gate import Policy, judge, static

    cache, baseline = inference_baseline
    (k,) = keys(inference_ws)
    cheat = redteam.misbehaves_outside_the_sandbox((inference_ws / "graphs" / k / "wrapper.py").read_text())
    assert static.screen(cheat) == [] and [f.code for f in static.allowlist(cheat)] == ["allowlist-attribute"]
    if sandbox.level() == "namespaces":  # elsewhere the workers' process ids are large: the gate would see it
        (tmp_path / "cheat.py").write_text(cheat)
        with monkeypatch.context() as m:
            m.setattr(static, "screen", lambda text: [])  # the whole static stage off: the dynamic line alone
            v = h.settled(lambda: judge(inference_ws / "graphs" / k, tmp_path / "cheat.py",
                                        Policy(seed=0, time_budget_s=3.0, confirm=False)))
        assert not v.accepted and v.codes in (["not-faster"], h.TOO_BUSY) and v.stage == "timing", v.reasons
    install_direct(inference_ws, k, cheat.encode())
    unverified = run(EXAMPLES / "inference.py", "--steps", "2", cache=cache)
    assert number(unverified, "checksum") != baseline  # without the check the program gets its zeros
    p = run(EXAMPLES / "inference.py", "--steps", "2", cache=cache, env={"TILESMITH_VERIFY": "1"})
    s = stats_of(p)
    assert s["verified"][k]["failed"].startswith("output 0 differs"), s["verified"]
    assert number(p, "checksum") == baseline
    assert store.get(k) is None and [r["key"] for r in store.revoked()] == [k]  # no later run loads it
    again = run(EXAMPLES / "inference.py", "--steps", "2", cache=cache)
    assert number(again, "checksum") == baseline and stats_of(again)["substituted"] == 0


def test_verify_passes_every_honest_training_graph_whose_code_reuses_its_inputs_memory(tmp_path, training_ws):
    """Inductor's backward may write into its saved activations' memory (donated buffers); the check must
    give each wrapper the inputs as they were before the call, or an honest artifact looks wrong."""
    ks = keys(training_ws)
    for k in ks:
        install_direct(training_ws, k, marker_artifact((training_ws / "graphs" / k / "wrapper.py").read_text(), k))
    cache = tmp_path / "cache"
    p = run(EXAMPLES / "training.py", "--steps", "3", cache=cache, env={"TILESMITH_VERIFY": "2"})
    plain = run(EXAMPLES / "training.py", "--steps", "3", cache=cache, runtime=False)
    assert p.returncode == 0 and plain.returncode == 0, p.stderr + plain.stderr
    s = stats_of(p)
    assert s["substituted"] == 4 and s["fallbacks"] == [] and warnings_in(p) == [], s
    # calls 1 and 2 of each graph checked, call 3 with probability 2/3
    assert all(2 <= s["verified"][k]["verified_calls"] <= 3 for k in ks) and set(s["verified"]) == set(ks), s["verified"]
    assert len(s["marker_hits"]) == 12  # 4 graphs x 3 steps: the artifact runs once per call, checked or not
    assert number(p, "loss") == number(plain, "loss")


def test_perturbed_inference_artifact_shows_in_the_output_and_never_leaks_into_inductors_cache(
        inference_ws, inference_baseline):
    cache, baseline = inference_baseline
    (k,) = keys(inference_ws)
    install_direct(inference_ws, k, marker_artifact((inference_ws / "graphs" / k / "wrapper.py").read_text(), k, True))
    # Warm cache only: the cold path is covered by the training and the gate tests.
    p = run(EXAMPLES / "inference.py", "--steps", "2", cache=cache)
    s = stats_of(p)
    assert (s["substituted"], s["marker_hits"]) == (1, [k[:12], k[:12]])
    assert number(p, "checksum") != baseline
    # The same warm cache without the runtime: Inductor's own code again (the cache is not polluted).
    plain = run(EXAMPLES / "inference.py", "--steps", "2", cache=cache, runtime=False)
    assert number(plain, "checksum") == baseline


def test_the_runtime_says_once_at_exit_what_it_substituted_and_nothing_when_it_substituted_nothing_or_is_quiet(
        inference_ws, inference_baseline):
    cache, _ = inference_baseline
    (k,) = keys(inference_ws)
    p = run(EXAMPLES / "inference.py", "--steps", "2", cache=cache)  # nothing installed
    assert p.returncode == 0 and stats_of(p)["substituted"] == 0 and "tilesmith" not in p.stderr, p.stderr
    install_direct(inference_ws, k, marker_artifact((inference_ws / "graphs" / k / "wrapper.py").read_text(), k))
    p = run(EXAMPLES / "inference.py", "--steps", "2", cache=cache)
    assert p.returncode == 0 and stats_of(p)["substituted"] == 1, p.stderr
    # the store's evidence for every artifact install_direct makes: a 2.0x speedup
    assert notice_in(p) == ["tilesmith: loaded 1 installed graph(s) in place of Inductor's (2.00x faster at the gate); "
                            "TILESMITH_RUNTIME_QUIET=1 hides this line"], p.stderr
    assert warnings_in(p) == [] and p.stderr.endswith(notice_in(p)[0] + "\n")  # after the program's own output
    quiet = run(EXAMPLES / "inference.py", "--steps", "2", cache=cache, env={"TILESMITH_RUNTIME_QUIET": "1"})
    assert quiet.returncode == 0 and stats_of(quiet)["substituted"] == 1 and "tilesmith" not in quiet.stderr, quiet.stderr


@pytest.mark.parametrize("case", ["tampered", "wrong-environment", "raises-at-import", "missing-file"])
def test_unusable_artifact_falls_back_to_inductors_code_with_one_warning(case, inference_ws, inference_baseline):
    cache, baseline = inference_baseline
    (k,) = keys(inference_ws)
    good = marker_artifact((inference_ws / "graphs" / k / "wrapper.py").read_text(), k, perturb=True)
    env = json.loads((inference_ws / "graphs" / k / "graph.json").read_text())["environment"]
    if case == "wrong-environment":
        install_direct(inference_ws, k, good, environment={**env, "torch": "0.0.1"})
    elif case == "raises-at-import":
        install_direct(inference_ws, k, good + b"\nraise RuntimeError('artifact exploded')\n")
    else:
        install_direct(inference_ws, k, good)
        if case == "tampered":
            store.artifact_path(k).write_bytes(good.replace(b"1000.0", b"2000.0"))
        else:
            store.artifact_path(k).unlink()
    p = run(EXAMPLES / "inference.py", "--steps", "2", cache=cache)
    assert p.returncode == 0, p.stderr
    s = stats_of(p)
    assert (s["graphs_seen"], s["substituted"], s["marker_hits"]) == (1, 0, [])
    assert number(p, "checksum") == baseline
    why = {"tampered": "do not match the manifest", "wrong-environment": "another environment",
           "raises-at-import": "artifact exploded", "missing-file": "artifact file missing"}[case]
    assert len(s["fallbacks"]) == 1 and why in s["fallbacks"][0]["reason"]
    (w,) = warnings_in(p)
    assert w.startswith(f"tilesmith: {k[:12]}: ") and why in w and w.endswith("using Inductor's code")


@pytest.mark.parametrize("perturb", [False, True], ids=["agrees", "differs"])
def test_verify_checks_calls_against_inductors_code_and_drops_and_removes_an_artifact_that_differs(
        perturb, inference_ws, inference_baseline):
    """TILESMITH_VERIFY=1: the program's first call (and later ones at random) runs the artifact and Inductor's code
    on copies; an artifact whose output differs (here +1000, which the gate would reject, installed past it) never
    reaches the program: it gets Inductor's outputs, one warning, Inductor's code from then on, and the artifact is
    removed from the store."""
    cache, baseline = inference_baseline
    (k,) = keys(inference_ws)
    install_direct(inference_ws, k, marker_artifact((inference_ws / "graphs" / k / "wrapper.py").read_text(), k, perturb))
    p = run(EXAMPLES / "inference.py", "--steps", "3", cache=cache, env={"TILESMITH_VERIFY": "1"})
    assert p.returncode == 0, p.stderr
    plain = run(EXAMPLES / "inference.py", "--steps", "3", cache=cache, runtime=False)
    s = stats_of(p)
    assert s["substituted"] == 1 and number(p, "checksum") == number(plain, "checksum")
    v = s["verified"][k]
    if perturb:
        assert v["verified_calls"] == 0 and v["failed"].startswith("output 0 differs"), v
        assert s["marker_hits"] == [k[:12]]  # the artifact ran once, beside Inductor's code, then never
        (w,) = warnings_in(p)
        assert "call 1 checked against Inductor's code: output 0 differs" in w and w.endswith("using Inductor's code")
        assert "removed from the store" in w and store.get(k) is None and store.revoked()[-1]["key"] == k
    else:
        assert v["calls"] == 3 and 1 <= v["verified_calls"] <= 3 and v["failed"] == "", v
        assert s["marker_hits"] == [k[:12]] * 3 and s["fallbacks"] == [] and warnings_in(p) == []
        assert store.get(k) is not None


def test_strict_mode_turns_a_fallback_into_an_error(inference_ws, inference_baseline):
    cache, _ = inference_baseline
    (k,) = keys(inference_ws)
    install_direct(inference_ws, k, b"# not what the manifest says\n")
    store.artifact_path(k).write_bytes(b"# tampered\n")
    p = run(EXAMPLES / "inference.py", cache=cache, env={"TILESMITH_RUNTIME_STRICT": "1"})
    assert p.returncode != 0
    assert f"tilesmith: {k[:12]}: artifact bytes do not match" in p.stderr


def test_capture_records_inductors_own_code_even_with_an_artifact_installed(tmp_path, inference_ws):
    (k,) = keys(inference_ws)
    install_direct(inference_ws, k, marker_artifact((inference_ws / "graphs" / k / "wrapper.py").read_text(), k, True))
    ws = tmp_path / "ws"
    p = run_capture_subprocess(EXAMPLES / "inference.py", ws, "--steps", "1")
    assert p.returncode == 0, p.stderr
    assert keys(ws) == [k]
    from tilesmith.capture.rerun import rerun

    r = rerun(ws / "graphs" / k)  # captured outputs come from Inductor's wrapper, not the perturbed artifact
    assert r.ok, r.problems


def test_a_cuda_graph_artifact_loads_in_the_users_process_and_runs_plain_on_cpu(inference_ws, inference_baseline):
    """An artifact that ends with `call = graphed(call)` imports tilesmith.cudagraph inside the user's
    program; on CPU tensors it makes the plain call, so the output is Inductor's, and stats() says why."""
    from tilesmith.search.graphed import graphed_text

    cache, baseline = inference_baseline
    (k,) = keys(inference_ws)
    install_direct(inference_ws, k, graphed_text((inference_ws / "graphs" / k / "wrapper.py").read_text()).encode())
    p = run(EXAMPLES / "inference.py", "--steps", "2", cache=cache)
    s = stats_of(p)
    assert s["substituted"] == 1 and s["fallbacks"] == [], p.stderr
    g = s["cuda_graphs"][k]
    assert list(s["cuda_graphs"]) == [k] and (g["replays"], g["plain_calls"]) == (0, 2)
    assert g["plain_reasons"] == ["not all tensors on one CUDA device"] and g["layouts"][0]["captures"] == 0
    assert number(p, "checksum") == baseline
