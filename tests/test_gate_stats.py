"""Pure parts of the gate: timing statistics, sample plausibility, input sets, verdict JSON, policy."""

from __future__ import annotations

import json
import math
import random
import time

import pytest
import torch

from tilesmith.gate import Policy, Verdict
from tilesmith.gate import sizing, timing, windows
from tilesmith.gate.correctness import compare_values
from tilesmith.gate.inputs import make_sets
from tilesmith.gate.verdict import Pass, Reason, SetCorrectness, Timing


def _samples(ratio: float, n: int, noise: float, seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    b, c = [], []
    for _ in range(n):
        drift = math.exp(rng.gauss(0, 0.2))  # shared by the pair: the machine got slower or faster
        b.append(int(1e6 * drift * math.exp(rng.gauss(0, noise))))
        c.append(int(1e6 / ratio * drift * math.exp(rng.gauss(0, noise))))
    return b, c


def test_sign_test_rank_matches_the_binomial_tail():
    assert timing.sign_test_rank(5, 0.995) == 0  # 1/32 > 0.005: no bound from five rounds
    assert timing.sign_test_rank(10, 0.99) == 1  # P(B <= 0) = 1/1024 <= 0.01 < P(B <= 1) = 11/1024
    assert timing.sign_test_rank(100, 0.995) == 37  # normal approximation: 50 - 2.576 * 5 = 37.1
    assert timing.sign_test_rank(4000, 0.995) == pytest.approx(2000 - 2.576 * 31.62, abs=2)  # no overflow


def test_paired_estimate_accepts_a_real_speedup_and_rejects_equal_timings():
    b, c = _samples(1.5, 40, 0.03, 1)
    est = timing.estimate(b, c, 0.995)
    assert est.low > 1.4 and timing.decide(est, 0.02) == "accept"
    b, c = _samples(1.0, 300, 0.03, 2)
    est = timing.estimate(b, c, 0.995)
    assert est.low < 1.0 < est.high and timing.decide(est, 0.02) == "reject"


def test_paired_estimate_false_accept_rate_on_equal_timings_stays_below_half_a_percent():
    accepted = 0
    for seed in range(400):
        b, c = _samples(1.0, 24, 0.05, seed)
        accepted += timing.decide(timing.estimate(b, c, 0.995), 0.02) == "accept"
    assert accepted <= 2


def test_paired_estimate_is_robust_to_preempted_samples():
    b, c = _samples(1.3, 60, 0.02, 3)
    for i in range(0, 60, 4):
        b[i] *= 3  # the OS took the core away during a quarter of the baseline samples
        c[i + 2] *= 3  # and of the candidate samples
    est = timing.estimate(b, c, 0.995)
    assert est.speedup == pytest.approx(1.3, rel=0.05) and est.low > 1.2


def test_a_sample_is_the_window_the_parent_measured_never_the_number_the_worker_reports():
    """The worker's own number only has to be a positive int: the time is the parent's (marks, else wall)."""
    from types import SimpleNamespace

    marked = SimpleNamespace(marks=[1_000, 51_000], sent_ns=400)
    s, bad = windows.measured(marked, {"ns": 7}, 10**9, 0)  # a worker that claims 7 ns
    assert bad is None and (s.ns, s.pre_ns, s.short_ns) == (50_000, 600, 49_993)
    s, bad = windows.measured(SimpleNamespace(marks=None), {"ns": 7}, 2_000_000, 0)  # no marks on this platform
    assert bad is None and (s.ns, s.pre_ns) == (2_000_000, 0)
    for bad_ns in (0, -1, 1.5, True, None, "1"):
        assert windows.measured(marked, {"ns": bad_ns}, 10**9, 0)[1].code == "timing-forged"


def test_input_sets_keep_layout_and_integer_ranges_and_perturb_parameters():
    idx = torch.tensor([3, 7, 5, 3])
    x = torch.randn(8, 6).t()  # non-contiguous
    w = torch.ones(6)
    meta = {"inputs": [
        {"kind": "tensor", "range": {"min": 3, "max": 7}, "parameter": False},
        {"kind": "tensor", "range": {"min": -2.0, "max": 2.0, "mean": 0.0, "std": 1.0}, "parameter": False},
        {"kind": "tensor", "range": {"min": 1.0, "max": 1.0, "mean": 1.0, "std": 0.0}, "parameter": True},
        {"kind": "symint", "value": 5},
    ]}
    sets = dict(make_sets(meta, [idx, x, w, 5], seed=0, random_sets=4))
    assert list(sets) == ["captured", "normal-0", "uniform-1", "positive-2", "heavy-3", "zeros", "large",
                          "captured-weights"]
    assert torch.equal(sets["captured-weights"][2], w) and sets["captured-weights"][2] is not sets["captured"][2]
    assert not torch.equal(sets["captured-weights"][1], x)  # the weights as captured, the rest drawn anew
    for name, (i, xx, ww, s) in sets.items():
        assert xx.stride() == x.stride() and xx.shape == x.shape and s == 5
        assert i.dtype == torch.int64 and int(i.min()) >= 3 and int(i.max()) <= 7, name
    assert torch.equal(sets["captured"][1], x) and torch.equal(sets["captured"][2], w)
    assert not torch.equal(sets["normal-0"][2], w)  # a weight of another run, not the captured ones
    assert bool((sets["positive-2"][1] >= 0).all()) and float(sets["zeros"][1].abs().max()) == 0.0
    assert float(sets["large"][1].abs().max()) > 100 * float(x.abs().max()) * 0.99
    again = dict(make_sets(meta, [idx, x, w, 5], seed=0, random_sets=4))
    other = dict(make_sets(meta, [idx, x, w, 5], seed=1, random_sets=4))
    assert torch.equal(again["heavy-3"][1], sets["heavy-3"][1]) and not torch.equal(other["heavy-3"][1],
                                                                                     sets["heavy-3"][1])


def test_value_comparison_catches_bfloat16_compute_but_not_fp32_reordering():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 256, generator=g), torch.randn(256, 64, generator=g)
    ref = a.double() @ b.double()
    orig = a @ b
    reordered = (a[:, :128] @ b[:128] + a[:, 128:] @ b[128:])
    downgraded = (a.bfloat16() @ b.bfloat16()).float()
    assert compare_values(reordered, orig, ref).ok
    bad = compare_values(downgraded, orig, ref)
    assert not bad.ok and bad.why == "precision"
    assert not compare_values(downgraded, orig).ok  # without the float64 reference, too
    assert compare_values(orig * 0, orig, ref).why == "values"
    assert not compare_values(torch.tensor([1, 2]), torch.tensor([1, 3])).ok


def test_policy_takes_min_improvement_from_the_environment(monkeypatch):
    monkeypatch.setenv("TILESMITH_MIN_IMPROVEMENT", "0.07")
    assert Policy().min_improvement == 0.07
    monkeypatch.delenv("TILESMITH_MIN_IMPROVEMENT")
    assert Policy().min_improvement == 0.02


def test_verdict_round_trips_through_json():
    t = Timing("launch", 1.0, 0.5, 2.0, 1.8, 2.2, 30, 4, [1, 2], [3, 4])
    v = Verdict(True, "confirmation", "k" * 64, "s" * 64, [Reason("x", "y")], [Reason("w", "z")],
                Pass(1, [SetCorrectness("captured", True, 0.0, 0.0, 1e-8, 1e-8)], t), Pass(2, [], t), True, 0.02, 3.5)
    assert Verdict.from_dict(json.loads(json.dumps(v.to_dict()))) == v


class _ScriptedTimingWorker:
    """Answers the timing stage's one-sample `time` requests with seeded samples: 200 ns for the baseline,
    200 / ratio for the candidate (less than the time spent making them, so they always fit in the wall
    time the parent measures). One instance plays both workers, the timer and the candidate's."""

    def __init__(self, ratio: float, noise: float, seed: int):
        self.rng = random.Random(seed)
        self.ratio, self.noise = ratio, noise

    def request(self, msg: dict, timeout_s: float, read=None) -> dict:
        if msg["op"] != "time":  # `keep`: the parent's word on the last candidate sample
            return {"ok": True}
        base = 200 if msg["role"] == "baseline" else 200 / self.ratio
        ns = int(base * math.exp(self.rng.gauss(0, self.noise)))
        self.sent_ns, self.marks = 0, [10, 10 + ns]  # the window as the kernel stamped its marks
        return {"ok": True, "ns": ns}


def test_futility_bound_ends_equal_timings_sooner_and_never_adds_an_accept():
    def run(futility: float, ratio: float, seed: int):
        policy = Policy(min_improvement=0.02, futility_confidence=futility, time_budget_s=1e9, max_rounds=3000)
        w = _ScriptedTimingWorker(ratio, 0.03, seed)
        t, reasons, kept = timing.measure(w, w, policy, "launch", 1, 200.0)
        assert kept and kept[-1].start == t.samples - 1  # the last timed call is always among the checked
        return t.samples, not reasons

    plain = [run(0.995, 1.0, s) for s in range(40)]  # futility at the accept confidence: the old rule
    early = [run(0.95, 1.0, s) for s in range(40)]
    assert sum(n for n, _ in early) < sum(n for n, _ in plain)
    assert not any(ok for _, ok in early) and not any(ok for _, ok in plain)
    assert all(ok for _, ok in (run(0.95, 1.10, s) for s in range(10)))  # a clear win is still accepted


def test_calibration_bounds_are_exact_clopper_pearson():
    from benchmarks.gate_calibration import binomial_cdf, clopper_pearson

    lo, hi = clopper_pearson(0, 600)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.05 ** (1 / 600), rel=1e-6) and hi < 0.005  # ~3/N
    lo, hi = clopper_pearson(190, 200)
    assert binomial_cdf(190, 200, hi) == pytest.approx(0.05, abs=1e-6)  # P(X <= 190 | upper) = 5 %
    assert 1 - binomial_cdf(189, 200, lo) == pytest.approx(0.05, abs=1e-6)  # P(X >= 190 | lower) = 5 %
    assert lo < 0.95 < hi and clopper_pearson(200, 200)[1] == 1.0


def test_timing_contents_draw_weights_once_share_them_and_no_value_depends_on_threads(monkeypatch):
    """The timed calls' sets: a weight keeps one value through them (drawn once, the same tensor in every
    set, nothing drawn only to be thrown away), the other inputs change from set to set; and the big
    tensors drawn side by side on threads get exactly the values a serial draw gives."""
    from tilesmith.gate import Policy
    from tilesmith.gate import inputs as I
    from tilesmith.gate.original import timing_contents

    g = torch.Generator().manual_seed(0)
    w, x, y = (torch.randn(300, 300, generator=g).bfloat16(), torch.randn(400, 200, generator=g),
               torch.randn(70000, generator=g))
    meta = {"inputs": [{"kind": "tensor", "parameter": True, "range": {"min": -4.0, "max": 4.0, "mean": 0.0, "std": 1.0}},
                       {"kind": "tensor", "parameter": False}, {"kind": "tensor", "parameter": False}]}
    fills = []
    real_fill = I._fill
    monkeypatch.setattr(I, "_fill", lambda t, *a: fills.append(t.shape) or real_fill(t, *a))
    policy = Policy()
    contents = timing_contents(meta, [w, x, y], 7, policy)
    n = 2 * policy.rotating_sets
    assert len(contents) == n and fills.count(w.shape) == 1 and fills.count(x.shape) == n
    assert all(c[0] is contents[0][1][0] for _, c in contents)
    assert not torch.equal(contents[0][1][0], w) and contents[0][1][0].dtype == torch.bfloat16
    assert not torch.equal(contents[0][1][1], contents[1][1][1])
    threaded = I.make_sets(meta, [w, x, y], seed=3)
    monkeypatch.setattr(I, "_BIG", 1 << 40)  # every tensor drawn in this thread
    serial = I.make_sets(meta, [w, x, y], seed=3)
    for (name, a), (_, b) in zip(threaded, serial):
        assert all(torch.equal(p, q) for p, q in zip(a, b)), name


def test_inputs_near_float32s_limit_are_drawn_without_overflowing():
    """An attention mask filled with finfo(float32).min (std ~1.7e38): drawn in float32, mean + spread * z
    overflowed to inf in most rows (a softmax row with one +inf is all NaN, and NaN elements are left out
    of the comparison); such inputs are drawn in float64, as before."""
    lo = torch.finfo(torch.float32).min
    mask = torch.triu(torch.full((128, 128), lo), diagonal=1)
    meta = {"inputs": [{"kind": "tensor", "parameter": False,
                        "range": {"min": lo, "max": 0.0, "mean": float(mask.double().mean()), "std": float(mask.double().std())}}]}
    sets = dict(make_sets(meta, [mask], seed=0))
    assert bool(torch.isfinite(sets["uniform-1"][0]).all())
    assert float((sets["normal-0"][0] == float("inf")).float().mean()) < 0.01  # 2.2 % when drawn in float32


def _compare_values_before(cand, orig, ref=None):
    """compare_values as it was before the float32 fast path (session 11), for the test below."""
    from tilesmith.gate import correctness as cr

    if cand.shape != orig.shape or cand.dtype != orig.dtype:
        return cr.ValueCheck(False, why="values")
    c, o = cand.to(torch.float64), orig.to(torch.float64)
    if not (torch.equal(c.isnan(), o.isnan()) and torch.equal(c.isinf() & (c > 0), o.isinf() & (o > 0))
            and torch.equal(c.isinf() & (c < 0), o.isinf() & (o < 0))):
        return cr.ValueCheck(False, float("inf"), float("inf"), why="nonfinite")
    fin = torch.isfinite(o)
    if not bool(fin.any()):
        return cr.ValueCheck(True)
    c, o = c[fin], o[fin]
    diff = (c - o).abs()
    scale = max(float(o.abs().max()), 1e-30)
    rtol, atol = cr._TOL.get(orig.dtype, (1e-3, 1e-3))
    allowed = rtol * o.abs() + atol * scale
    res = cr.ValueCheck(bool((diff <= allowed).all()), float(diff.max()), float(diff.max()) / scale, float(allowed.max()))
    if ref is not None:
        r = ref.to(torch.float64)[fin]
        rscale = max(float(r.abs().max()), 1e-30)
        res.ref_cand, res.ref_orig = float((c - r).abs().max()), float((o - r).abs().max())
        floor = cr.REF64_FLOOR_EPS * cr._EPS.get(orig.dtype, 1e-3) * rscale
        res.allowed = cr.REF64_FACTOR * res.ref_orig + floor
        res.ok = res.ref_cand <= res.allowed
        if orig.dtype in (torch.float16, torch.bfloat16):
            rms_c, rms_o = float((c - r).square().mean().sqrt()), float((o - r).square().mean().sqrt())
            if res.ok and rms_c > cr.REF64_RMS_FACTOR * rms_o + floor / 20:
                res.ok = False
    if not res.ok:
        band = max(cr.PRECISION_BAND, 16 * cr._EPS.get(orig.dtype, 0.0))
        res.why = "precision" if res.rel_error < band else "values"
    return res


def test_value_comparison_decides_as_before_its_float32_fast_path():
    """Half-precision outputs are now compared in float32 and all-finite outputs skip the non-finite
    checks: the same decisions as the float64 comparison on outputs right, near the tolerance, lower
    precision, wrong, with NaN and inf (matching or not), with and without a float64 reference."""
    g = torch.Generator().manual_seed(3)
    cases = 0
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        rtol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-5, torch.float64: 1e-10}[dtype]
        for shape in ((), (7,), (33, 65)):
            for rel in (0.0, 0.3 * rtol, 0.9 * rtol, 1.5 * rtol, 5 * rtol, 0.5):
                for special in ("none", "nan-both", "inf-both", "nan-cand"):
                    ref = torch.randn(shape, generator=g, dtype=torch.float64) * 3
                    orig = ref.to(dtype)
                    noise = torch.randn(shape, generator=g, dtype=torch.float64) * rel * ref.abs().clamp(min=1e-3)
                    cand = (ref + noise).to(dtype)
                    if special != "none" and orig.numel() > 1:
                        bad = float("nan") if special.startswith("nan") else float("inf")
                        orig.view(-1)[0] = bad if special != "nan-cand" else orig.view(-1)[0]
                        cand.view(-1)[0] = bad
                    for r in (None, ref):
                        new, old = compare_values(cand, orig, r), _compare_values_before(cand, orig, r)
                        assert (new.ok, new.why) == (old.ok, old.why), (dtype, shape, rel, special, r is None, new, old)
                        if old.abs_error not in (0.0, float("inf")):
                            assert abs(new.abs_error - old.abs_error) <= 1e-6 * old.abs_error + 1e-30
                        cases += 1
    assert cases == 4 * 3 * 6 * 4 * 2
    assert compare_values(torch.empty(0, 3), torch.empty(0, 3)).ok


def test_samples_sized_from_plain_launches_grow_for_a_replay_timed_in_its_own_mode_never_past_the_buffers():
    """In graph timing the sizes came from the original's plain launches: on the H200 the MoE's samples were
    2 calls (0.3 ms of replays) where a sample should take about 2 ms. Sized again from the replay's own
    per-call time: more calls and, where needed, more buffer sets (never more calls than sets); never fewer."""
    policy = Policy()
    contents = [("captured", [torch.zeros(8, 8), torch.zeros(4)])]
    reps, buffers = sizing.sample_size(policy, 1.0e6, contents, set())  # 1 ms a call as plain launches
    assert reps <= buffers and reps == max(1, round(policy.target_sample_ms))
    more, sets, again = sizing.resize(policy, reps, buffers, 0.15e6, contents, set())  # 0.15 ms replayed
    assert more == round(policy.target_sample_ms / 0.15) and sets >= more and again == (sets > buffers)
    assert sizing.resize(policy, reps, buffers, 5.0e6, contents, set()) == (reps, buffers, False)  # never fewer


class _Hog:
    """The candidate's worker, scripted: clearly slower than the original, and a hog in its process that uses
    half a core while another worker's sample runs (the timer sleeps through each of its samples)."""

    def __init__(self):
        self.cpu = 0

    def cpu_ns(self) -> int:
        return self.cpu

    def request(self, msg: dict, timeout_s: float, read=None) -> dict:
        if msg["op"] != "time":
            return {"ok": True}
        t0 = time.perf_counter_ns()
        while time.perf_counter_ns() - t0 < 2000:  # a sample must fit in the wall time the parent measures
            pass
        ns = 200 if msg["role"] == "baseline" else 400
        self.sent_ns, self.marks = 0, [10, 10 + ns]
        return {"ok": True, "ns": ns}


class _SleepyTimer:
    def __init__(self, hog: _Hog):
        self.hog = hog

    def request(self, msg: dict, timeout_s: float, read=None) -> dict:
        time.sleep(0.003)
        self.hog.cpu += 1_500_000  # what the hog spins while this sample runs
        self.sent_ns, self.marks = 0, [10, 210]
        return {"ok": True, "ns": 200}


def test_no_decision_before_the_idle_watch_has_seen_enough_of_other_workers_samples():
    """A candidate clearly slower after one batch (12 rounds, ~36 ms of the timer's samples) had a hog in its
    process that used 18 ms of CPU meanwhile: under the idle watch's 20-ms floor, so it was rejected only as
    not faster, and a hog that made the original look slow would have been accepted. Sampling now goes on
    until the watch has seen timing.IDLE_WALL_MIN_NS of other workers' samples."""
    hog = _Hog()
    policy = Policy(min_improvement=0.02, time_budget_s=60.0)
    t, reasons, _ = timing.measure(_SleepyTimer(hog), hog, policy, "launch", 1, 200.0)
    assert [r.code for r in reasons] == ["background-work"], reasons
    assert t.idle_wall_ms >= timing.IDLE_WALL_MIN_NS / 1e6 and t.samples > policy.min_rounds


def test_a_kept_timed_sample_must_name_a_drawn_call_and_the_last_with_their_outputs():
    """The kept samples come back from files in the candidate's own folder: one emptied or bent there is a
    protocol failure, never a sample skipped unchecked."""
    import torch

    from tilesmith.gate.timed import _kept_ok
    from tilesmith.gate.timing import CheckedSample
    from tilesmith.gate.worker.tensors import outputs_digest

    outs = [[torch.arange(6.0).reshape(2, 3)], [torch.ones(2, 3)]]
    s = CheckedSample(12, [0], 7, outputs_digest(outs))
    good = {"start": 12, "calls": [3, 5], "outputs": outs}
    assert _kept_ok(good, s, 6)
    for bad in ({**good, "calls": []}, {**good, "calls": [3]}, {**good, "calls": [3, 4]}, {**good, "calls": [-1, 5]},
                {**good, "calls": [6, 5]}, {**good, "outputs": outs[:1]}, {**good, "start": 0}, {"start": 12}, None, "x"):
        assert not _kept_ok(bad, s, 6), bad
    # Outputs changed after the worker bound them (the files are in the candidate's folder): not the sample's.
    assert not _kept_ok({**good, "outputs": [[torch.arange(6.0).reshape(2, 3)], [torch.zeros(2, 3)]]}, s, 6)
    assert not _kept_ok(good, CheckedSample(12, [0], 7, None), 6)  # no digest from the worker: not accepted


def test_the_kept_outputs_digest_sees_every_value_and_is_the_same_for_a_copy():
    import torch

    from tilesmith.gate.worker.tensors import _to_cpu, outputs_digest

    base = torch.randn(4, 6).to(torch.bfloat16)
    cases = [[base, base.t(), base[1:, ::2], torch.tensor(3), torch.empty(0, 2), None, 7]]
    d = outputs_digest(cases)
    assert outputs_digest([[_to_cpu(x) for x in cases[0]]]) == d  # the layout-keeping CPU copy the worker saves
    changed = base.clone()
    changed[3, 5] += 1
    assert outputs_digest([[changed, *cases[0][1:]]]) != d
    assert outputs_digest([[base.reshape(6, 4), *cases[0][1:]]]) != d  # same bytes, another shape
    assert outputs_digest([[base.float(), *cases[0][1:]]]) != d


def test_a_gate_worker_sample_needs_both_window_marks_and_reports_its_spans():
    class Worker:  # a gate worker answers a time request after marking its window twice
        def __init__(self, marks):
            self.marks_given = marks

        def request(self, msg, timeout_s, read=None):
            self.marks = list(self.marks_given)
            time.sleep(0.001)  # the sample's own time, inside the request's wall time
            return {"ns": 900}

    w = Worker([100, 1_100])
    w.sent_ns = 40  # when the parent wrote the request (the clock the kernel stamps marks with)
    s, bad, _ = timing._sample(w, {"op": "time", "reps": 1}, 5.0)
    assert bad is None and (s.ns, s.short_ns, s.pre_ns) == (1_000, 100, 60)
    for marks in ([], [100], [1, 2, 3], [5, 1]):
        s, bad, _ = timing._sample(Worker(marks), {"op": "time", "reps": 1}, 5.0)
        assert s is None and bad.code == "timing-forged" and "window marks" in bad.message


class _RegimeWorker:
    """The original's samples 30 ms for the first `busy` of its samples (a job beside, as seen on the 2-core machine),
    then 0.02 ms; the candidate 0.025 ms throughout: 0.8x, the original's true speed once the job is gone."""

    def __init__(self, busy: int):
        self.busy, self.seen = busy, 0

    def request(self, msg: dict, timeout_s: float, read=None) -> dict:
        if msg["op"] != "time":
            return {"ok": True}
        if msg["role"] == "baseline":
            self.seen += 1
            ns = 30_000_000 if self.seen <= self.busy else 20_000
        else:
            ns = 25_000
        self.sent_ns, self.marks = 0, [10, 10 + ns]
        return {"ok": True, "ns": ns}


def test_an_original_measured_while_the_machine_was_busy_is_measured_again_never_used():
    """A candidate 0.8x as fast as the original was accepted at 1.43x on an original timed while another job ran:
    samples far slower than the original alone are measured again; if they stay so, the decision says so."""
    w = _RegimeWorker(busy=20)  # most of the first pass's samples of the original (apart and beside) contaminated
    t, reasons, _ = timing.measure(w, w, Policy(time_budget_s=5.0), "launch", 1, 20_000.0)
    assert [r.code for r in reasons] == ["not-faster"] and t.speedup < 1.0  # the second pass, on a quiet machine
    w = _RegimeWorker(busy=10**6)  # busy for good
    t, reasons, _ = timing.measure(w, w, Policy(time_budget_s=5.0), "launch", 1, 20_000.0)
    assert [r.code for r in reasons] == ["unstable-timing"] and "each of 3 passes" in reasons[0].message
    w = _RegimeWorker(busy=0)  # quiet: the first pass stands
    t, reasons, _ = timing.measure(w, w, Policy(time_budget_s=5.0), "launch", 1, 20_000.0)
    assert [r.code for r in reasons] == ["not-faster"] and w.seen < 200


def test_load_that_outlasts_two_passes_is_waited_out_by_the_third(monkeypatch):
    """Another job's load for two whole passes (a test run beside the gate): the third pass, quiet, decides; the two
    before it are never used."""
    w, passes = _RegimeWorker(busy=0), []
    real = timing._sample_rounds

    def counted(*a, **k):
        passes.append(1)
        w.busy = w.seen + (10**6 if len(passes) <= 2 else 0)  # this pass's original busy throughout, or quiet
        return real(*a, **k)

    monkeypatch.setattr(timing, "_sample_rounds", counted)
    t, reasons, _ = timing.measure(w, w, Policy(time_budget_s=5.0), "launch", 1, 20_000.0)
    assert len(passes) == 3 and [r.code for r in reasons] == ["not-faster"] and t.speedup < 1.0


class _Stalls:
    """/proc/pressure/cpu's `some total` (microseconds) as a machine busy `share` of the wall time would make it."""

    def __init__(self, share: float):
        self.share, self.t0, self.reads = share, time.monotonic(), 0

    def __call__(self) -> int:
        self.reads += 1
        return int((time.monotonic() - self.t0) * self.share * 1e6)


def test_a_pass_runs_longer_only_on_a_busy_machine_and_only_where_asked(monkeypatch):
    policy = Policy(time_budget_s=2.0)
    for share, extend, budget in ((0.9, 3.0, 6.0), (0.05, 3.0, 2.0), (0.9, 1.0, 2.0)):
        stalls = _Stalls(share)
        monkeypatch.setattr(timing.procfs, "cpu_pressure_us", stalls)
        busy = {"extend": extend, "stall0": stalls() if extend > 1 else None}
        time.sleep(0.05)
        assert timing._budget_s(policy, busy, 0.05) == budget == busy["budget_s"]
        assert stalls.reads == (2 if extend > 1 else 0)  # CUDA's passes (extend 1) never read it
    monkeypatch.setattr(timing.procfs, "cpu_pressure_us", lambda: None)  # a kernel without it: the budget stands
    assert timing._budget_s(policy, {"extend": 3.0, "stall0": None}, 1.0) == 2.0


class _Slow:
    """A worker whose every sample takes 2 ms of wall time and reads 20 us with noise: the original, and a candidate
    as fast as it, which no pass can show faster or slower."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def request(self, msg: dict, timeout_s: float, read=None) -> dict:
        if msg["op"] != "time":
            return {"ok": True}
        time.sleep(0.002)
        ns = int(20_000 * math.exp(self.rng.gauss(0.0, 0.3)))
        self.sent_ns, self.marks = 0, [10, 10 + ns]
        return {"ok": True, "ns": ns}


def test_a_busy_machines_longer_pass_looks_no_more_often_than_one_given_that_budget(monkeypatch):
    """What a longer pass gives a candidate (one that keeps the machine busy to get it, say) is more samples: each
    look's bounds keep their confidence, and the batches go on doubling past the plain budget, so the pass looks at
    its samples about as often as a pass given the longer budget from the start (the API's gate_time_budget_s), not
    every few rounds."""
    looks: list = []
    look = timing._look
    monkeypatch.setattr(timing, "_look", lambda *a: (looks.append(len(a[1])), look(*a))[1])
    seen = {}
    for name, share, budget, extend in (("quiet", 0.0, 0.4, 3.0), ("busy", 0.9, 0.4, 3.0), ("long", 0.0, 1.2, 1.0)):
        monkeypatch.setattr(timing.procfs, "cpu_pressure_us", _Stalls(share))
        looks.clear()
        rng = random.Random(7)
        # As fast, needing nothing more: undecided, so every pass runs its whole budget.
        t, reasons, _ = timing.measure(_Slow(rng), _Slow(rng), Policy(time_budget_s=budget, min_improvement=0.0),
                                       "launch", 1, 20_000.0, busy_extend=extend)
        assert [r.code for r in reasons] == ["not-faster"]
        seen[name] = (list(looks), t)
    quiet, busy, long = seen["quiet"][1], seen["busy"][1], seen["long"][1]
    assert quiet.budget_s == 0.4 and quiet.busy_share == 0.0 and busy.budget_s == pytest.approx(1.2)
    assert busy.busy_share > 0.8 and busy.samples > 2 * quiet.samples
    assert len(seen["busy"][0]) <= len(seen["long"][0]) + 2, seen


class _BesideSlowed:
    """Two workers: the timer's original 20 us a sample; in the candidate's worker the candidate 22 us (0.91x) and
    the original beside it 30 ms for the first `spoil` of its samples (the candidate's process slowing it: it runs
    there), then 20 us. `keeps` counts the check words the candidate's worker hears (True ones)."""

    def __init__(self, role_ns: dict, spoil: int = 0):
        self.role_ns, self.spoil, self.seen, self.keeps = role_ns, spoil, 0, 0

    def request(self, msg: dict, timeout_s: float, read=None) -> dict:
        if msg["op"] == "warm" and msg.get("keep"):
            self.keeps += 1
        if msg["op"] != "time":
            return {"ok": True}
        ns = self.role_ns[msg["role"]]
        if msg["role"] == "baseline" and self.spoil:
            self.seen += 1
            ns = 30_000_000 if self.seen <= self.spoil else ns
        self.sent_ns, self.marks = 0, [10, 10 + ns]
        return {"ok": True, "ns": ns}


def test_an_original_slowed_only_beside_the_candidate_is_not_measured_again_and_the_apart_comparison_binds():
    """The original beside the candidate runs in the candidate's process, which can slow it at will: were that a
    reason to measure the pass again, the candidate would choose which passes count (a best of several draws)."""
    timer = _BesideSlowed({"baseline": 20_000})
    cand = _BesideSlowed({"baseline": 20_000, "candidate": 22_000}, spoil=10**6)
    t, reasons, _ = timing.measure(timer, cand, Policy(time_budget_s=5.0), "launch", 1, 20_000.0)
    assert [r.code for r in reasons] == ["not-faster"] and t.apart_speedup < 1.0 < t.beside_speedup
    assert t.samples == len(t.beside_ns)  # one pass: no second one was measured


def test_the_cap_on_checked_samples_counts_each_pass_alone():
    """A pass measured again keeps drawing checks: were the cap shared, a first pass that used it up would leave every
    round of the next unchecked but each batch's last, and the candidate hears every word."""
    rng = random.Random(3)
    # Every role 30 ms a call, 1500x the original alone: every pass is measured; the candidate at the needed 1.02x
    # stays undecided long past the cap (with this seed the first two passes to their 200th round, the third ended by
    # the futility bound at its 192nd).
    t, reasons, kept = timing.measure(_Jittery(rng, 30_000_000), _Jittery(rng, 30_000_000, 1.02),
                                      Policy(time_budget_s=5.0, max_rounds=200), "launch", 1, 20_000.0)
    assert [r.code for r in reasons] == ["unstable-timing"] and t.samples >= 4 * timing.MAX_CHECKED_SAMPLES
    # Each pass kept its own 24 (and each batch's last round); a shared cap left the later passes only the latter.
    assert len(kept) >= timing.UNSTABLE_PASSES * timing.MAX_CHECKED_SAMPLES


class _Jittery:
    """A worker whose every sample takes `ns` with log-normal noise (sigma 0.1), the candidate's `speed` times less."""

    def __init__(self, rng: random.Random, ns: int, speed: float = 1.0):
        self.rng, self.ns, self.speed = rng, ns, speed

    def request(self, msg: dict, timeout_s: float, read=None) -> dict:
        if msg["op"] != "time":
            return {"ok": True}
        ns = int(self.ns * math.exp(self.rng.gauss(0.0, 0.1)) / (self.speed if msg["role"] == "candidate" else 1.0))
        self.sent_ns, self.marks = 0, [10, 10 + ns]
        return {"ok": True, "ns": ns}
