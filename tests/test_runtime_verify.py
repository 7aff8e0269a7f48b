"""TILESMITH_VERIFY (tilesmith/runtime/verify.py): an artifact's calls checked against Inductor's code in the
program itself, at calls it cannot foresee. Unit tests on wrapper-shaped functions here; the user's flow (a captured
example, an installed artifact, the program run with the runtime) is in tests/test_runtime.py."""

from __future__ import annotations

import torch

from tilesmith.runtime.verify import Verified, calls_wanted


def _wrapper(body):
    """A wrapper-ABI callable: call(args) takes the list, clears it, returns a tuple."""
    def call(args):
        xs = list(args)
        args.clear()
        return body(*xs)
    return call


def _verified(fn, original, left=2, mutated=(), static=(), draw=lambda: 1.0):
    """draw: the random numbers after the first `left` calls (1.0: none of them checked)."""
    fails = []
    v = Verified(_wrapper(fn), _wrapper(original), "k" * 64, left, mutated, static, lambda k, why: fails.append(why),
                 draw=draw)
    return v, fails


def test_an_artifact_that_agrees_is_verified_and_the_program_gets_its_outputs():
    v, fails = _verified(lambda x, w: (x @ w,), lambda x, w: ((x @ w).clone(),))
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    args = [x, w]
    (y,) = v(args)
    assert args == [] and torch.equal(y, x @ w)
    v([x, w])
    v([x, w])  # past the verified calls: the artifact alone
    assert v.describe() == {"calls": 3, "verified_calls": 2, "within_slack": 0, "unchecked_out_of_memory": 0,
                            "failed": ""}
    assert fails == []


def test_an_artifact_that_differs_is_dropped_for_inductors_code_from_that_call_on():
    calls = {"artifact": 0, "original": 0}

    def artifact(x):
        calls["artifact"] += 1
        return (x * 2 + 1000,)

    def original(x):
        calls["original"] += 1
        return (x * 2,)

    v, fails = _verified(artifact, original, left=3)
    x = torch.randn(16)
    (y,) = v([x])
    assert torch.equal(y, x * 2)  # the program never saw the artifact's values
    for _ in range(3):
        (y,) = v([x])
        assert torch.equal(y, x * 2)
    assert calls == {"artifact": 1, "original": 4}
    assert len(fails) == 1 and "call 1" in fails[0] and "output 0 differs" in fails[0]
    assert v.describe()["failed"].startswith("output 0 differs")


def test_an_artifact_that_raises_or_returns_another_arity_fails_the_check():
    def boom(x):
        raise RuntimeError("kernel exploded")

    v, fails = _verified(boom, lambda x: (x + 1,))
    (y,) = v([torch.zeros(3)])
    assert torch.equal(y, torch.ones(3)) and "raised RuntimeError: kernel exploded" in fails[0]
    v, fails = _verified(lambda x: (x + 1, x), lambda x: (x + 1,))
    v([torch.zeros(3)])
    assert "2 outputs where Inductor's code returns 1" in fails[0]


def test_updates_in_place_happen_once_on_the_programs_tensor_and_are_compared():
    def update(buf, x):  # a wrapper that updates input 0 in place (a running statistic)
        buf.mul_(0.5).add_(x)
        return (buf * 1.0,)

    v, fails = _verified(update, update, mutated=[0])
    buf, x = torch.ones(5), torch.full((5,), 2.0)
    v([buf, x])
    assert torch.equal(buf, torch.full((5,), 2.5)) and fails == []  # once, not twice

    def wrong_update(buf, x):
        buf.mul_(0.5)  # forgets the add: the returned value happens to be right, the update is not
        return ((buf + x) * 1.0,)

    v, fails = _verified(wrong_update, update, mutated=[0])
    buf = torch.ones(5)
    v([buf, x])
    assert torch.equal(buf, torch.full((5,), 2.5))  # the program's tensor has Inductor's update
    assert "input 0 after the call differs" in fails[0]


def test_an_artifact_that_writes_an_input_the_graph_does_not_update_fails_and_the_program_keeps_its_tensor():
    def sneaky(x, w):
        w.zero_()
        return (x.sum(0, keepdim=True),)

    v, fails = _verified(sneaky, lambda x, w: (x.sum(0, keepdim=True),))
    w = torch.ones(2)
    v([torch.ones(3, 2), w])
    assert "input 1 changed, which the graph does not update" in fails[0]
    assert torch.equal(w, torch.ones(2))  # the program's weight as Inductor's code left it


def test_above_the_copy_budget_static_inputs_are_shared_and_a_write_to_one_is_still_caught(monkeypatch):
    from tilesmith.runtime import verify

    monkeypatch.setattr(verify, "VERIFY_COPY_BYTES", 0)

    def sneaky(x, w):
        y = x @ w
        w.zero_()
        return (y,)

    v, fails = _verified(sneaky, lambda x, w: (x @ w,), static=[1])
    w = torch.ones(2, 2)
    v([torch.ones(3, 2), w])
    assert fails  # Inductor's code, run after it on the shared weight, read the zeros: its outputs differ
    assert not w.any()  # shared, not copied: caught, but the write stays (the docstring says so)


def test_inductors_code_may_reuse_an_inputs_memory_and_the_artifact_still_sees_the_values_before_the_call():
    def reuses(saved, g):  # a backward writing its result into a saved activation's memory (a donated buffer)
        return (saved.mul_(g),)

    v, fails = _verified(reuses, reuses)
    saved = torch.full((4,), 3.0)
    (y,) = v([saved, torch.full((4,), 2.0)])
    assert torch.equal(y, torch.full((4,), 6.0)) and fails == [] and v.verified == 1


def test_most_of_an_output_wrong_is_not_a_rounding_difference():
    v, fails = _verified(lambda x: (torch.where(x.abs() < 50, 0.0, x),), lambda x: (x * 1.0,))
    x = torch.ones(100)
    x[0] = 100.0
    v([x])
    assert fails and "output 0 differs" in fails[0]  # 99 of 100 values zeroed, each off by 1 of a 100 scale


def test_random_draws_see_the_same_state_and_the_programs_rng_moves_as_with_inductors_code_alone():
    def rand_like(x):
        return (x + torch.rand(x.shape),)

    v, fails = _verified(rand_like, rand_like)
    torch.manual_seed(7)
    v([torch.zeros(6)])
    after_verified = torch.rand(3)
    torch.manual_seed(7)
    rand_like(torch.zeros(6))
    assert fails == [] and torch.equal(after_verified, torch.rand(3))


def test_a_sum_reordered_past_the_fixed_tolerance_is_counted_not_acted_on():
    v, fails = _verified(lambda x: (x * (1 + 1e-4),), lambda x: (x * 1.0,))
    v([torch.randn(64)])
    assert fails == [] and v.describe()["within_slack"] == 1 and v.describe()["verified_calls"] == 1


def test_an_output_with_other_strides_fails_the_check():
    v, fails = _verified(lambda x: (x.t().contiguous().t(),), lambda x: (x.clone(),))
    v([torch.randn(3, 4)])
    assert "has strides (1, 3), Inductor's (4, 1)" in fails[0]


def test_the_setting_reads_a_count_and_ignores_what_is_not_one(monkeypatch):
    for value, want in (("", 0), ("3", 3), ("0", 0), ("-2", 0), ("lots", 0)):
        monkeypatch.setenv("TILESMITH_VERIFY", value)
        assert calls_wanted() == want


def test_after_the_first_calls_each_call_is_checked_with_a_probability_that_falls_as_one_over_its_number():
    draws = iter([0.5, 0.9, 0.2, 0.99])  # calls 3..6 with N=2: checked where draw * k < 2
    v, fails = _verified(lambda x: (x + 1,), lambda x: (x + 1,), left=2, draw=lambda: next(draws))
    for _ in range(6):
        v([torch.zeros(2)])
    # calls 1, 2 always; 3: 1.5 < 2 yes; 4: 3.6 no; 5: 1.0 yes; 6: 5.94 no
    assert v.describe()["verified_calls"] == 4 and v.calls == 6 and fails == []


def test_an_artifact_right_for_its_first_calls_and_stale_after_is_caught_later_at_a_call_it_cannot_foresee():
    """A cheat that counts its calls (or guesses how many are checked) and serves stale outputs after them: with the
    system's entropy the checks go on, ever sparser, and one lands."""
    import random

    state = {"n": 0}

    def counts(x):
        state["n"] += 1
        return (x * 2 if state["n"] <= 100 else torch.zeros_like(x),)

    rng = random.Random(0)
    v, fails = _verified(counts, lambda x: (x * 2,), left=3, draw=rng.random)
    for _ in range(3000):
        (y,) = v([torch.ones(4)])
        assert torch.equal(y, torch.full((4,), 2.0)) or not fails  # after the failed check, Inductor's results
    assert fails and "output 0 differs" in fails[0] and 100 < v.calls and v.describe()["failed"]


def test_a_checked_call_hands_the_artifact_the_programs_own_tensors_as_any_other_call():
    seen = []

    def artifact(x):
        seen.append(x.data_ptr())
        return (x + 1,)

    v, fails = _verified(artifact, lambda x: (x + 1,), left=1)
    x = torch.zeros(8)
    v([x])  # checked
    v([x])  # not checked
    assert seen == [x.data_ptr(), x.data_ptr()] and fails == [] and v.verified == 1
