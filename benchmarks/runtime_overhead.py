"""What `import tilesmith.runtime` costs a program: import time, time per graph Inductor hands back
(canonical hash + store lookup, and loading an artifact), and time per call (none by construction:
the substituted callable is a wrapper module's `call`, the same kind Inductor installs).

usage: python benchmarks/runtime_overhead.py [--reps N] [--out results.json]
Prints a table and writes JSON; never passes or fails on time. Uses a temporary TILESMITH_HOME.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def import_cost_ms(reps: int) -> dict:
    """Median wall time of `python -c "import tilesmith.runtime"` minus `python -c "pass"`, ms."""
    def wall(code: str) -> float:
        samples = []
        for _ in range(reps):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            samples.append((time.perf_counter() - t) * 1e3)
        return statistics.median(samples)

    base, rt = wall("pass"), wall("import tilesmith.runtime")
    return {"python_ms": base, "with_runtime_ms": rt, "import_cost_ms": rt - base}


def per_call_ms(fn, x, calls: int, reps: int) -> float:
    """Median over `reps` of (time of `calls` calls) / calls, in ms."""
    for _ in range(10):
        fn(x)
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(calls):
            fn(x)
        out.append((time.perf_counter() - t) * 1e3 / calls)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    os.environ["TILESMITH_HOME"] = tempfile.mkdtemp(prefix="tilesmith-bench-home-")
    results = {"import": import_cost_ms(args.reps)}

    import tilesmith.runtime as rt
    import torch
    from tilesmith import source, store
    from tilesmith.runtime import hook

    seen = []
    hook.add_handler(lambda pc: seen.append(pc.graph.source_code))

    def f(x):  # x: [4096] -> [4096]
        return torch.relu(x) * 2 + 1

    x = torch.randn(4096)
    inductor_fn = torch.compile(f)
    inductor_fn(x)
    src = seen[-1]
    env = rt.current_environment()
    key = source.graph_key(source.canonicalize(src, rt._default_cache_dirs()), env)

    # Per graph, no artifact installed: canonical hash + fingerprint + one stat().
    n = 200
    t = time.perf_counter()
    for _ in range(n):
        k = source.graph_key(source.canonicalize(src, rt._default_cache_dirs()), rt.current_environment())
        (store.manifest_path(k)).exists()
    lookup_ms = (time.perf_counter() - t) * 1e3 / n

    # Per graph, artifact installed: the same source as the artifact, so only the loading differs.
    store.put(key, source.canonicalize(src).encode(), kind="inference", environment=env,
              evidence=store.Evidence(1.0, 1.0, 1.0, "launch"), provenance={"optimizer": "benchmark"})
    from torch._inductor.codecache import PyCodeCache

    t = time.perf_counter()
    for _ in range(20):
        rt._load(store.artifact_path(key).read_text(), {})
    load_ms = (time.perf_counter() - t) * 1e3 / 20
    del PyCodeCache  # imported above only to exclude its import from the timed loop

    torch._dynamo.reset()
    substituted_fn = torch.compile(f)
    substituted_fn(x)
    assert rt.stats().substituted == 1, rt.stats()
    calls = 2000
    results["per_graph"] = {"wrapper_kb": len(src) / 1024, "hash_and_lookup_ms": lookup_ms,
                            "load_artifact_ms (warm kernel cache)": load_ms}
    results["per_call"] = {
        "inductor_us": per_call_ms(inductor_fn, x, calls, args.reps) * 1e3,
        "substituted_us": per_call_ms(substituted_fn, x, calls, args.reps) * 1e3,
        "note": "same code in both; the callable type is a module-level call() in both",
    }
    rows = [("import tilesmith.runtime", f"{results['import']['import_cost_ms']:.1f} ms"),
            (f"per graph: hash + lookup ({len(src) / 1024:.1f} KB wrapper)", f"{lookup_ms:.3f} ms"),
            ("per graph: load an installed artifact (warm kernel cache)", f"{load_ms:.2f} ms"),
            ("per call: Inductor's wrapper", f"{results['per_call']['inductor_us']:.1f} us"),
            ("per call: substituted (identical code)", f"{results['per_call']['substituted_us']:.1f} us")]
    w = max(len(r[0]) for r in rows)
    print(f"{'what':<{w}}  cost\n{'-' * w}  ----")
    for a, b in rows:
        print(f"{a:<{w}}  {b}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
