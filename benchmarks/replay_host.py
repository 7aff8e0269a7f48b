"""Host time per call of tilesmith.cudagraph's lean replay, next to a bare CUDA-graph replay and the
plain launches, for a wrapper-shaped function with many static inputs (weights) and one moving input.

usage: python benchmarks/replay_host.py [--static 50] [--calls 3000] [--out replay_host.json]

The function does little GPU work (two small kernels), so a call's wall time is its host time: N calls
back to back, one synchronisation at the end, wall / N. Paths:
  graph.replay()            a CUDA graph captured by hand, nothing else (the floor)
  lean, outputs dropped     tilesmith.cudagraph: the weights read in place (one address check),
                            the moving input copied in, the output handed out without a copy
  lean, nothing moves       the same with the same input tensor every call: only the address check
                            (every argument read in place: one pass over the list, in C where
                            tilesmith.replay.native is built: this script builds it first, as install does)
  ..., Python check         the same with the check in Python (what runs without that build)
  lean, output kept         the same while the caller keeps each output for one call (copied out)
  copy everything           what the replay did before: every input copied in (one _foreach_copy_
                            per dtype), replay, every output copied out
  plain launches            the function itself
Then the pieces of a replay one by one (address check, use counts, stream, copy, replay, detach).
Prints a table and writes JSON; never passes or fails on time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def make(n_static: int, device: str):
    import torch

    g = torch.Generator().manual_seed(0)
    # Weights of mixed dtypes, as a bf16 model with fp32 norms has: the copy path groups them by dtype.
    ws = [torch.randn(64, 64, generator=g).to(device, torch.float32 if i % 3 == 2 else torch.bfloat16)
          for i in range(n_static)]
    xs = [torch.randn(8, 64, generator=g).to(device, torch.bfloat16) for _ in range(2)]  # alternates: copied

    def fn(args):  # an Inductor wrapper's ABI: a list the callee clears, a tuple of outputs
        x, w0 = args[0], args[1]
        args.clear()
        return ((x @ w0).relu_(),)

    return fn, ws, xs


def per_call_us(call, calls: int, reps: int, sync) -> list[float]:
    """`reps` samples of (wall time of `calls` back-to-back calls, one sync at the end) / calls, in us."""
    for _ in range(20):
        call()
    sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            call()
        sync()
        out.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return out


def paths(fn, ws, xs, torch):
    from tilesmith.cudagraph import graphed

    static_x = xs[0].clone()
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn([static_x, *ws])
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        static_out = fn([static_x, *ws])
    i = [0]

    def flip():
        i[0] ^= 1
        return xs[i[0]]

    lean = graphed(fn)
    still = graphed(fn)  # the same input tensor every call: all 51 inputs read in place, nothing copied
    kept = graphed(fn)
    keep = [None]

    def lean_kept():
        keep[0] = kept([flip(), *ws])  # held until the next call returns

    statics = [static_x.clone()] + [w.clone() for w in ws]
    groups = {}
    for k, t in enumerate(statics):
        groups.setdefault(t.dtype, []).append(k)
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        out2 = fn(list(statics))

    def copy_all():
        args = [flip(), *ws]
        for idxs in groups.values():
            torch._foreach_copy_([statics[k] for k in idxs], [args[k] for k in idxs])
        g2.replay()
        return tuple(o.clone() for o in out2)

    return {"graph.replay()": graph.replay, "lean, outputs dropped": lambda: lean([flip(), *ws]),
            "lean, nothing moves": lambda: still([xs[0], *ws]),
            "lean, output kept": lean_kept, "copy everything": copy_all,
            "plain launches": lambda: fn([flip(), *ws])}, {"lean": lean, "still": still, "kept": kept, "_keep": static_out}


def pieces(fn, ws, xs, torch) -> dict:
    """Host time of each step of a lean replay on its own (us per call; launches synchronised at the end)."""
    from tilesmith.replay import record as cg_rec
    from tilesmith.replay import native

    args = [xs[0], *ws]
    idx = list(range(1, len(args)))
    ptrs = [None] + [w.data_ptr() for w in ws]
    st = ws[0].untyped_storage()
    dp, want = torch.Tensor.data_ptr, [ptrs[i] for i in idx]
    every = [x.data_ptr() for x in args]
    packed = native.pack(every)
    dst = xs[1].clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dst.add_(1)
    calls = {
        f"address check, {len(idx)} inputs (C++)": lambda: cg_rec._ptrs_equal(args, ptrs, idx),
        f"address check, {len(idx)} inputs (Python data_ptr)": lambda: [dp(args[i]) for i in idx] == want,
        f"address check, all {len(args)} (map data_ptr)": lambda: list(map(dp, args)) == every,
        **({f"address check, all {len(args)} (tilesmith.replay.native, C)": lambda: cg_rec._same_ptrs(args, packed)}
           if cg_rec._same_ptrs is not None else {}),
        "storage use count (one output)": lambda: cg_rec._use_count(st._cdata),
        "current raw stream": lambda: torch._C._cuda_getCurrentRawStream(0),
        "capturing check": lambda: torch._C._cuda_isCurrentStreamCapturing(),
        "detach (one output)": lambda: ws[0].detach(),
        "copy_ (one input)": lambda: dst.copy_(xs[0]),
        "_foreach_copy_ (one input)": lambda: torch._foreach_copy_([dst], [xs[0]]),
        "graph.replay() (one kernel)": g.replay,
        "list(args) + clear": lambda: list(args).clear(),
    }
    return {k: statistics.median(per_call_us(c, 2000, 5, torch.cuda.synchronize)) for k, c in calls.items()}


def bookkeeping(g, args: list, calls: int, reps: int, torch) -> tuple[list[float], list[dict]]:
    """The lean replay's host time with every recorded graph's replay() a no-op (what is left is tilesmith's
    own Python and the torch calls it makes), and where a real replay's time goes under cProfile."""
    import cProfile
    import pstats

    def call():
        g(list(args))

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(prof)
    top = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:12]
    profile_top = [{"function": f"{pstats.func_std_string(k)}", "ncalls": v[1],
                    "us_per_call": v[2] / calls * 1e6} for k, v in top]

    class _NoReplay:
        def replay(self):
            pass

    saved = []
    for lay in g._layouts.values():
        for rec in lay.recs:
            saved.append((rec, rec.graph))
            rec.graph = _NoReplay()
    try:
        us = per_call_us(call, calls, reps, torch.cuda.synchronize)
    finally:
        for rec, graph in saved:
            rec.graph = graph
    return us, profile_top


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--static", type=int, default=50, help="static inputs (weights) besides the moving one")
    ap.add_argument("--calls", type=int, default=3000, help="calls per sample")
    ap.add_argument("--reps", type=int, default=7, help="samples per path")
    ap.add_argument("--out", default="replay_host.json")
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("replay_host: needs CUDA (the lean replay makes the plain call on CPU); nothing measured")
        Path(a.out).write_text(json.dumps({"skipped": "no CUDA"}))
        return 0
    from tilesmith.replay import native

    built = native.build()[1]  # as `tilesmith install` does on a CUDA machine; before the replay is imported
    print(f"the address check in C: {built}")
    fn, ws, xs = make(a.static, "cuda")
    ps, keep = paths(fn, ws, xs, torch)
    rows = []
    for name, call in ps.items():
        us = per_call_us(call, a.calls, a.reps, torch.cuda.synchronize)
        rows.append({"path": name, "median_us": statistics.median(us), "min_us": min(us), "samples_us": us})
    from tilesmith.replay import graphed as cudagraph, record as cudagraph_record

    if cudagraph._same_ptrs is not None:  # the same path with the check in Python (no build, another torch)
        cudagraph._same_ptrs = cudagraph_record._same_ptrs = None
        try:
            us = per_call_us(ps["lean, nothing moves"], a.calls, a.reps, torch.cuda.synchronize)
        finally:
            cudagraph._same_ptrs = cudagraph_record._same_ptrs = native.same_ptrs()
        rows.append({"path": "lean, nothing moves, Python check", "median_us": statistics.median(us),
                     "min_us": min(us), "samples_us": us})
    layouts = {k: keep[k].describe() for k in ("lean", "still", "kept")}
    stub_us, profile_top = bookkeeping(keep["still"], [xs[0], *ws], a.calls, a.reps, torch)
    rows.append({"path": "lean, nothing moves, replay stubbed", "median_us": statistics.median(stub_us),
                 "min_us": min(stub_us), "samples_us": stub_us})
    parts = pieces(fn, ws, xs, torch)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "static_inputs": a.static,
           "address_check": native.status(),
           "calls_per_sample": a.calls, "rows": rows, "lean_layouts": layouts, "pieces_us": parts,
           "profile_nothing_moves": profile_top,
           "date": time.strftime("%Y-%m-%d")}
    print(f"host time per call, {a.static} static inputs + 1 moving, on {doc['device']} (torch {doc['torch']})")
    print(f"address check: {doc['address_check']}")
    print(f"{'path':34} {'median us':>10} {'min us':>8}")
    for r in rows:
        print(f"{r['path']:34} {r['median_us']:10.2f} {r['min_us']:8.2f}")
    print(f"lean layouts: {json.dumps(layouts)}")
    print("pieces of a replay, host us per call:")
    for k, v in parts.items():
        print(f"  {k:40} {v:8.2f}")
    print("lean, nothing moves, under cProfile (tottime per call, us; the profiler's own cost inflates each):")
    for r in profile_top:
        print(f"  {r['us_per_call']:8.2f}  {r['ncalls']:>8}  {r['function']}")
    Path(a.out).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
