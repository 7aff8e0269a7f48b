"""tilesmith.cudagraph on CUDA: a real Inductor wrapper replayed from a CUDA graph gives the plain
call's outputs on new inputs, never hands out its own buffers, keeps to the caller's stream, steps
aside inside the caller's own capture, and the gate accepts it as faster for a launch-bound graph."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests import gate_helpers as h  # noqa: E402
from tests.conftest import EXAMPLES, run_capture_subprocess  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def launch_graph(tmp_path_factory, inductor_cache) -> Path:
    ws = tmp_path_factory.mktemp("ws-graphed") / "ws"
    p = run_capture_subprocess(EXAMPLES / "inference.py", ws, "--device", "cuda", "--steps", "3")
    assert p.returncode == 0, p.stderr
    return h.graph_of(ws)


def _modules(graph: Path):
    from tilesmith.capture import loading
    from tilesmith.search.graphed import graphed_text

    data = loading.load_graph_data(graph)
    text = (graph / "wrapper.py").read_text()
    return data, loading.load_module(text, data.constants), loading.load_module(graphed_text(text), data.constants)


def _fresh(inputs, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(x.shape, generator=g, device=x.device).to(x.dtype).as_strided(x.shape, x.stride())
            if isinstance(x, torch.Tensor) and x.dtype.is_floating_point and x.is_contiguous() else
            (x.clone() if isinstance(x, torch.Tensor) else x) for x in inputs]


def _close(got, want) -> None:
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_gpu_graphed_replays_give_the_plain_outputs_and_outputs_the_caller_keeps_never_change(launch_graph):
    from tilesmith.capture import loading

    data, plain, wrapped = _modules(launch_graph)
    kept = []
    for seed in range(5):
        inputs = _fresh(data.inputs, seed) if seed else data.inputs
        got = wrapped.call(loading.clone_args(inputs))
        want = plain.call(loading.clone_args(inputs))
        torch.cuda.synchronize()
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
            assert a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
        kept.append(([a.clone() for a in got], got))
    for copies, outs in kept:  # later calls did not write into what earlier calls returned
        assert all(torch.equal(c, o) for c, o in zip(copies, outs))
    # The first call is the plain warm-up; every call's inputs moved (captures 2 and 3 learn that and copy
    # them in from then on), and the caller kept every output: another instance took the fifth call (ROTATE
    # at most; once every instance's outputs are held, those outputs are copied out instead).
    assert wrapped.call.replays == 4 and wrapped.call.plain_calls == 1, wrapped.call.plain_reasons()
    (lay,) = wrapped.call.describe()
    assert (lay["outputs_copied"] >= 1 or lay["instances"] >= 2) and lay["reason"] is None, lay


def test_gpu_graphed_caller_that_keeps_one_earlier_call_besides_the_last_gets_a_third_instance_not_copies(launch_graph):
    """The gate's timed samples hold the last call's outputs and those of one call drawn at random (for its
    checks): a third instance takes the calls while two are held, so no output is copied out (with two
    instances every output was copied out from then on, a cost the program never pays)."""
    from tilesmith.capture import loading

    data, plain, wrapped = _modules(launch_graph)
    args = loading.clone_args(data.inputs)
    sets = [_fresh(data.inputs, s) for s in range(3)]
    kept = last = None
    for k in range(12):
        for a, b in zip(args, sets[k % 3]):  # new values, same tensors: a later call overwriting them shows
            if isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
                a.copy_(b)
        want = [w.clone() for w in plain.call(list(args))]
        last = wrapped.call(list(args))
        _close(last, want)
        if k == 3:
            kept, want_kept = last, want  # held to the end, like the gate's drawn call
    _close(kept, want_kept)
    (lay,) = wrapped.call.describe()
    assert lay["outputs_copied"] == 0 and lay["instances"] == 3 and lay["captures"] == 1, lay


def test_gpu_graphed_loop_that_holds_the_last_output_alternates_two_instances_and_copies_nothing(launch_graph):
    from tilesmith.capture import loading

    data, plain, wrapped = _modules(launch_graph)
    args = loading.clone_args(data.inputs)
    sets = [_fresh(data.inputs, s) for s in range(3)]
    y, prev, ptrs = None, None, []
    for k in range(9):  # `y = model(x)` in a loop: last step's y is alive while the next call runs
        for a, b in zip(args, sets[k % 3]):  # new values, same tensors (a data loader's pinned buffers)
            if isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
                a.copy_(b)
        want = [w.clone() for w in plain.call(list(args))]
        prev_copy = [t.clone() for t in prev] if prev is not None else None
        y = wrapped.call(list(args))
        _close(y, want)
        if prev_copy is not None:  # the call did not write into what the caller still held
            assert all(torch.equal(c, t) for c, t in zip(prev_copy, prev))
        ptrs.append(y[0].data_ptr())
        prev = y
    (lay,) = wrapped.call.describe()
    assert lay["outputs_copied"] == 0 and lay["instances"] == 2 and lay["captures"] == 1, lay
    assert lay["why_captured"][0] == "first capture" and lay["why_captured"][1].startswith("outputs held: [0"), lay
    assert len(set(ptrs[3:])) == 2 and ptrs[3] != ptrs[4] == ptrs[6]  # two instances take turns


def test_gpu_graphed_a_further_instance_that_fails_to_capture_copies_held_outputs_out_instead_of_running_plain(
        launch_graph, monkeypatch):
    """A third instance that does not fit (out of memory, over MAX_GRAPH_BYTES) leaves the two there working:
    the held outputs are copied out from then on, and the layout keeps replaying."""
    from tilesmith.capture import loading
    from tilesmith.replay import graphed as cudagraph

    data, plain, wrapped = _modules(launch_graph)
    args = loading.clone_args(data.inputs)
    sets = [_fresh(data.inputs, s) for s in range(3)]
    real_capture = cudagraph._Record.capture.__func__
    n = [0]

    def capture(cls, lay, real, pool):
        n[0] += 1
        if n[0] == 3:
            raise torch.cuda.OutOfMemoryError("no room for a third instance")
        return real_capture(cls, lay, real, pool)

    monkeypatch.setattr(cudagraph._Record, "capture", classmethod(capture))
    held = []
    for k in range(7):  # every output kept: the third instance is asked for, and fails
        for a, b in zip(args, sets[k % 3]):
            if isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
                a.copy_(b)
        want = [w.clone() for w in plain.call(list(args))]
        held.append((wrapped.call(list(args)), want))
    for got, want in held:  # nothing kept was overwritten
        _close(got, want)
    (lay,) = wrapped.call.describe()
    assert lay["reason"] is None and wrapped.call.plain_calls == 1 and wrapped.call.replays == 6, lay
    assert lay["outputs_copied"] >= 1 and any("instance 3 failed" in w for w in lay["why_captured"]), lay


def test_gpu_graphed_hands_out_the_graphs_own_outputs_when_the_caller_drops_them(launch_graph):
    from tilesmith.capture import loading

    data, plain, wrapped = _modules(launch_graph)
    args = loading.clone_args(data.inputs)
    want = [w.clone() for w in plain.call(list(args))]
    ptrs = set()
    for _ in range(5):
        out = wrapped.call(list(args))
        ptrs.add(out[0].data_ptr())
        torch.testing.assert_close(out[0], want[0], rtol=1e-5, atol=1e-5)
        del out
    (lay,) = wrapped.call.describe()
    assert lay["outputs_copied"] == 0 and lay["captures"] == 1 and lay["inputs_copied"] == 0
    assert len(ptrs) == 2  # the plain warm-up's, then always the graph's own memory: no copy


def test_gpu_graphed_reads_inputs_in_place_and_sees_in_place_updates(launch_graph):
    from tilesmith.capture import loading

    data, plain, wrapped = _modules(launch_graph)
    args = loading.clone_args(data.inputs)
    wrapped.call(list(args))
    wrapped.call(list(args))  # captured, every input read in place
    for x in args:
        if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
            x.mul_(0.5).add_(0.25)  # e.g. an optimizer step: same tensors, new values
    got = wrapped.call(list(args))
    want = plain.call(list(args))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    (lay,) = wrapped.call.describe()
    assert lay["captures"] == 1 and lay["inputs_copied"] == 0 and lay["inputs_in_place"] >= 1


@pytest.fixture(scope="module")
def c_check(tmp_path_factory):
    """tilesmith.replay.native's address check, built here for real (as `tilesmith install` does on a CUDA machine)."""
    from tilesmith.replay import native

    mp = pytest.MonkeyPatch()
    mp.setenv("TILESMITH_NATIVE_DIR", str(tmp_path_factory.mktemp("native")))
    for name in ("_same", "_status", "_tried"):
        mp.setattr(native, name, getattr(native, name))
    try:
        path, what = native.build()
        assert path is not None, what
        same = native.same_ptrs()
        assert same is not None, native.status()
        yield same
    finally:
        mp.undo()


@pytest.mark.parametrize("check", ["C", "Python"])
def test_gpu_graphed_steady_state_sees_weights_moved_under_the_same_tensor_objects(launch_graph, c_check,
                                                                                  monkeypatch, check):
    """The steady-state path's address check, in C (tilesmith.replay.native) and in Python: a `.data = ...` (as
    module.to() does) keeps every tensor object and moves its memory; the next call must see the new
    memory (capture again), never replay the old addresses."""
    from tilesmith.capture import loading
    from tilesmith.replay import graphed as cudagraph, record as cudagraph_record

    same = c_check if check == "C" else None
    monkeypatch.setattr(cudagraph, "_same_ptrs", same)
    monkeypatch.setattr(cudagraph_record, "_same_ptrs", same)
    data, plain, wrapped = _modules(launch_graph)
    args = loading.clone_args(data.inputs)
    for _ in range(4):
        _close(wrapped.call(list(args)), plain.call(list(args)))  # warm-up, capture, two steady-state replays
    assert wrapped.call.describe()[0]["address_check"] == check
    replays = wrapped.call.replays
    moved = [x for x in args if isinstance(x, torch.Tensor) and x.dtype.is_floating_point]
    assert moved
    for x in moved:
        x.data = (x * 0.5 + 0.25).clone()  # the same objects, new memory and new values
    _close(wrapped.call(list(args)), plain.call(list(args)))
    (lay,) = wrapped.call.describe()
    assert lay["captures"] == 2 and lay["why_captured"][-1].startswith("inputs moved: ["), lay
    assert wrapped.call.replays == replays + 1 and wrapped.call.plain_calls == 1
    _close(wrapped.call(list(args)), plain.call(list(args)))  # and the steady state again, at the new addresses
    assert wrapped.call.replays == replays + 2 and wrapped.call.describe()[0]["captures"] == 2


def test_gpu_graphed_inputs_that_move_are_recorded_again_then_copied(launch_graph):
    from tilesmith.capture import loading

    data, plain, wrapped = _modules(launch_graph)
    sets = [loading.clone_args(_fresh(data.inputs, s)) for s in range(6)]  # all alive: six addresses each
    for k in range(8):
        args = sets[k % len(sets)]
        _close(wrapped.call(list(args)), plain.call(list(args)))  # outputs not kept: handed out each time
    (lay,) = wrapped.call.describe()
    assert lay["captures"] == 3 and lay["inputs_in_place"] == 0 and lay["inputs_copied"] >= 1, lay
    assert wrapped.call.plain_calls == 1
    # Why each capture was made, as the runtime's stats show it: every input moved, then moved again.
    first, moved, again = lay["why_captured"]
    assert first == "first capture" and moved.startswith("inputs moved: [") and "(0 again" in moved, lay
    assert again.startswith("inputs moved: [") and "(0 again" not in again, lay


def _count_empty_cache(monkeypatch) -> list:
    calls = []
    real = torch.cuda.empty_cache
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: (calls.append(1), real())[1])
    return calls


def test_gpu_graphed_capture_keeps_the_allocators_cached_blocks(launch_graph, monkeypatch):
    """torch.cuda.graph empties the caching allocator before it captures; the replay captures without
    that, so a capture does not move where the caller's next allocations land."""
    from tilesmith.capture import loading

    data, plain, wrapped = _modules(launch_graph)
    args = loading.clone_args(data.inputs)
    wrapped.call(list(args))  # the plain warm-up
    spare = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    del spare  # a free 64 MiB segment in the cache
    reserved = torch.cuda.memory_reserved()
    emptied = _count_empty_cache(monkeypatch)
    wrapped.call(list(args))  # the capture, and its first replay
    (lay,) = wrapped.call.describe()
    assert lay["captures"] == 1 and lay["reason"] is None and wrapped.call.replays == 1, lay
    assert not emptied and torch.cuda.memory_reserved() >= reserved  # nothing of the cache given back


def test_gpu_graphed_inputs_made_anew_each_step_stay_in_place(launch_graph, monkeypatch):
    """A training step's backward reads the forward's saved activations: new tensors each step, which the
    caching allocator puts where the last step's were when the step allocates the same way. After the
    warm-up and one capture they are read in place: no re-record, no copy. The activations here sit in
    segments of their own (2 MiB or more each, the allocator's large pool), which an emptied cache would
    give back while they are free."""
    from tilesmith.capture import loading

    data, plain, wrapped = _modules(launch_graph)
    base = loading.clone_args(data.inputs)
    emptied = _count_empty_cache(monkeypatch)

    def act(x):
        if not isinstance(x, torch.Tensor) or not x.is_contiguous():
            return x.clone() if isinstance(x, torch.Tensor) else x
        big = torch.empty(max(x.numel(), (2 << 20) // x.element_size() + 1), dtype=x.dtype, device=x.device)
        return big[:x.numel()].view(x.shape).copy_(x)

    for step in range(10):
        temps = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (8, 3, 40)]  # the forward's
        acts = [act(x) for x in base]  # the saved activations
        del temps
        want = [w.clone() for w in plain.call(list(acts))]
        _close(wrapped.call(list(acts)), want)
        del acts, want
    (lay,) = wrapped.call.describe()
    assert lay["captures"] == 1 and lay["inputs_copied"] == 0 and wrapped.call.replays == 9, lay
    assert not emptied


def test_gpu_graphed_outputs_that_view_inputs_are_views_of_the_callers_inputs():
    from tilesmith.cudagraph import graphed

    def fn(args):
        x, w = args
        args.clear()
        return (x @ w, x[1:], w)

    g = graphed(fn)
    w = torch.randn(16, 4, device="cuda")
    for _ in range(4):  # new activations each call, the weight in place
        x = torch.randn(8, 16, device="cuda")
        y, xv, wo = g([x, w])
        torch.testing.assert_close(y, x @ w)
        assert wo is w and xv.data_ptr() == x[1:].data_ptr() and torch.equal(xv, x[1:])
    assert g.replays == 3 and g.plain_reasons() == []


def test_gpu_graphed_caller_that_keeps_everything_and_moves_everything_settles_on_copies_not_plain_calls():
    from tilesmith.cudagraph import MAX_RECORDS, graphed

    def fn(args):
        x, w = args
        args.clear()
        return (x @ w, (x @ w).sum(0))

    g = graphed(fn)
    kept = []
    for k in range(12):  # every input new and alive, every output kept: the worst caller
        x, w = torch.randn(8, 16, device="cuda"), torch.randn(16, 4, device="cuda")
        y, s = g([x, w])
        torch.testing.assert_close(y, x @ w)
        kept.append((x, w, y, s, (x @ w).clone()))
    for x, w, y, s, want in kept:  # nothing the caller kept was overwritten
        torch.testing.assert_close(y, want)
    (lay,) = g.describe()
    assert lay["captures"] <= MAX_RECORDS and g.plain_calls == 1 and g.replays == 11, lay


def test_gpu_graphed_wrapper_that_changes_a_moving_input_runs_plain_with_the_plain_effect():
    from tilesmith.cudagraph import graphed

    def fn(args):
        (x,) = args
        args.clear()
        x.add_(1.0)
        return (x * 2,)

    g = graphed(fn)
    xs = [torch.zeros(4, device="cuda") for _ in range(6)]
    for k, x in enumerate(xs):
        (y,) = g([x])
        assert torch.equal(x, torch.ones(4, device="cuda")) and torch.equal(y, torch.full((4,), 2.0, device="cuda")), k
    assert g.plain_reasons() and "changes input 0" in g.plain_reasons()[0]


def test_gpu_graphed_keeps_to_the_callers_stream(launch_graph):
    from tilesmith.capture import loading

    data, plain, wrapped = _modules(launch_graph)
    for _ in range(2):
        wrapped.call(loading.clone_args(data.inputs))  # the warm-up and the capture, on the default stream
    want = plain.call(loading.clone_args(data.inputs))
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        args = loading.clone_args(data.inputs)
        torch.cuda._sleep(50_000_000)  # the replay must wait behind this, on s
        got = wrapped.call(args)
        s.synchronize()  # only s: anything left on another stream would not be finished
        res = [g.cpu() for g in got]
    for a, b in zip(res, want):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-5, atol=1e-5)
    assert wrapped.call.replays >= 2


def test_gpu_graphed_steps_aside_inside_the_callers_own_capture(launch_graph):
    from tilesmith.capture import loading

    data, plain, wrapped = _modules(launch_graph)
    static = loading.clone_args(data.inputs)
    plain.call(loading.clone_args(data.inputs))  # warm
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = wrapped.call(list(static))
    g.replay()
    torch.cuda.synchronize()
    want = plain.call(loading.clone_args(data.inputs))
    for a, b in zip(outs, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert wrapped.call.plain_calls == 1 and wrapped.call.replays == 0 and wrapped.call.describe()[0]["calls"] == 0
    for _ in range(2):  # outside the capture: its own warm-up and graph, nothing remembered from inside
        wrapped.call(loading.clone_args(data.inputs))
    assert wrapped.call.replays == 1 and wrapped.call.plain_reasons() == []


def test_gpu_gate_accepts_the_graphed_wrapper_of_a_launch_bound_graph(launch_graph, tmp_path):
    from tilesmith.gate import Policy, judge
    from tilesmith.search.graphed import graphed_text

    cand = tmp_path / "graphed.py"
    cand.write_text(graphed_text((launch_graph / "wrapper.py").read_text()))
    v = judge(launch_graph, cand, Policy(time_budget_s=8.0))
    assert v.accepted, v.reasons
    assert v.first.timing.mode == "launch" and v.first.timing.speedup_low > 1.02
    assert all(c.ok for c in v.first.correctness) and v.confirmation.timing.speedup_low > 1.02


def test_gpu_trees_mode_reads_the_refilled_inputs_in_place_and_gives_the_plain_outputs(launch_graph):
    """The gate's trees mode (gate/worker/trees.py): the original through Inductor's cudagraph trees with
    every input static, one buffer set refilled between samples: each call sees the values just written
    (no stale copy in the trees' own placeholders) and gives the plain call's outputs."""
    from tilesmith.gate.worker.trees import tree_thunks

    data, plain, _ = _modules(launch_graph)
    bufs = _fresh(data.inputs, 0)
    thunks, alive = tree_thunks(plain.call, [bufs] * 3, "cuda:0", [])
    assert len(thunks) == 3 and alive is not None
    with torch.no_grad():
        for seed in range(1, 6):
            for dst, src in zip(bufs, _fresh(data.inputs, seed)):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
            got = [o.clone() for o in thunks[seed % 3]()]
            _close(got, plain.call(list(bufs)))


def test_gpu_trees_mode_with_inductors_static_marks_copies_the_others_in_from_each_buffer_set(launch_graph):
    """The trees mode where the capture recorded Inductor's static inputs (gate.inputs.trees_static): only
    those static, one thunk per buffer set: each call copies its own set's other inputs in (as the program's
    trees do) and gives the plain call's outputs on that set, refilled between samples."""
    from tilesmith.gate.inputs import parameter_indices, trees_static
    from tilesmith.gate.worker.trees import tree_thunks

    data, plain, _ = _modules(launch_graph)
    static = trees_static(data.meta)
    assert static is not None and set(static) <= parameter_indices(data.meta), data.meta.get("inductor_static_inputs")
    first = _fresh(data.inputs, 0)
    sets = [first] + [[first[i] if i in static else x for i, x in enumerate(_fresh(data.inputs, b))] for b in (1, 2)]
    thunks, alive = tree_thunks(plain.call, sets, "cuda:0", [], static)
    assert len(thunks) == 3 and alive is not None
    with torch.no_grad():
        for seed in range(3, 9):
            for b, bufs in enumerate(sets):
                for i, (dst, src) in enumerate(zip(bufs, _fresh(data.inputs, seed * 10 + b))):
                    if isinstance(dst, torch.Tensor) and i not in static:
                        dst.copy_(src)
            b = seed % 3
            got = [o.clone() for o in thunks[b]()]
            _close(got, plain.call(list(sets[b])))


@pytest.fixture(scope="module")
def ro_graph(tmp_path_factory, inductor_cache) -> Path:
    ws = tmp_path_factory.mktemp("ws-ro") / "ws"
    p = run_capture_subprocess(EXAMPLES / "inference.py", ws, "--device", "cuda", "--steps", "3", "--mode",
                               "reduce-overhead")
    assert p.returncode == 0, p.stderr
    return h.graph_of(ws)


def test_gpu_gate_times_a_plain_candidate_of_a_reduce_overhead_graph_through_the_trees_as_the_original(ro_graph,
                                                                                                     tmp_path):
    """Code the program's trees will run (not a replay of its own): the original and the candidate both
    through Inductor's cudagraph trees, each call from its own buffer set. The candidate here is the original's
    own code (A/A): rejected as not faster, with the trees set up for both roles (no fallback)."""
    from tilesmith.gate import Policy, judge
    from tilesmith.gate.inputs import trees_static

    assert trees_static(json.loads((ro_graph / "graph.json").read_text())) is not None
    cand = tmp_path / "same.py"
    cand.write_text((ro_graph / "wrapper.py").read_text())
    v = judge(ro_graph, cand, Policy(time_budget_s=8.0))
    codes = {w.code for w in v.warnings}
    assert "trees" in codes and "trees-unavailable" not in codes, [w.message for w in v.warnings]
    assert v.first.timing is not None and v.first.timing.samples > 0
    assert not v.accepted and v.codes == ["not-faster"], v.reasons


def test_gpu_gate_times_a_reduce_overhead_original_through_the_cudagraph_trees(ro_graph, tmp_path):
    """A graph compiled with reduce-overhead, judged against tilesmith's own replay of it: the original is
    timed through Inductor's cudagraph trees (as the program runs it), not as a bare replay, and the
    decision is a timing decision (accepted, or rejected as not faster), never a failure to set it up."""
    from tilesmith.gate import Policy, judge
    from tilesmith.search.graphed import graphed_text

    graph = ro_graph
    cand = tmp_path / "graphed.py"
    cand.write_text(graphed_text((graph / "wrapper.py").read_text()))
    v = judge(graph, cand, Policy(time_budget_s=8.0))
    codes = {w.code for w in v.warnings}
    assert "trees-unavailable" not in codes, [w.message for w in v.warnings]
    assert any(w.code == "own-replay" and "cudagraph trees" in w.message for w in v.warnings), v.warnings
    assert v.first.timing is not None and v.first.timing.mode == "graph"
    assert v.accepted or v.codes == ["not-faster"], v.reasons
    # Samples sized from the original timed through the trees, not from its plain launches (session 14 on
    # the H200: 2 calls, 0.3 ms a sample): about Policy.target_sample_ms each, unless the buffer sets cap them.
    t = v.first.timing
    assert t.calls_per_sample <= t.buffer_sets
    assert t.calls_per_sample * t.baseline_ms >= 0.5 * Policy().target_sample_ms or t.calls_per_sample >= 64, t
