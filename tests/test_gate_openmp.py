"""Where a CPU graph's gate workers run their OpenMP threads: each on a core of its own, unless the user chose."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests import gate_helpers as h
from tilesmith.gate import Policy, proc, timing
from tilesmith.gate.original import save_sets, timing_contents
from tilesmith.capture.loading import load_graph_data
from tilesmith.workspace import load_graph_json

CPUS = len(os.sched_getaffinity(0))


def test_threads_are_bound_to_cores_unless_the_user_chose_a_binding_or_fewer_threads():
    bound = proc.openmp_bind({"PATH": "/bin"})
    assert bound["OMP_PROC_BIND"] == "close" and bound["OMP_PLACES"] == "cores" and bound["PATH"] == "/bin"
    for mine in ({"OMP_PROC_BIND": "spread"}, {"OMP_PLACES": "threads"}, {"GOMP_CPU_AFFINITY": "0-3"},
                 {"KMP_AFFINITY": "compact"}, {"OMP_NUM_THREADS": "not a number"}):
        assert proc.openmp_bind(mine) == mine  # the user's choice, as given
    assert proc.openmp_bind({"OMP_NUM_THREADS": str(CPUS)})["OMP_PROC_BIND"] == "close"
    if CPUS > 1:  # fewer threads than CPUs: the workers are pinned to the last ones, which places from the first miss
        assert "OMP_PROC_BIND" not in proc.openmp_bind({"OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def inf_graph(inference_ws) -> Path:
    return h.graph_of(inference_ws)


def _threads(pid: int) -> dict[int, tuple[str, int]]:
    """{thread id: (the CPUs it may run on, its CPU time in clock ticks)} of process `pid`."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        mask = next(line.split()[1] for line in Path(f"/proc/{pid}/task/{t}/status").read_text().splitlines()
                    if line.startswith("Cpus_allowed_list:"))
        stat = Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()
        out[int(t)] = (mask, int(stat[11]) + int(stat[12]))
    return out


@pytest.mark.skipif(CPUS < 2, reason="one CPU: nothing to bind apart")
def test_a_cpu_workers_openmp_threads_each_run_on_a_core_of_their_own(tmp_path, inf_graph):
    """In a real gate worker, after the original's calls: the threads OpenMP started are bound one to a CPU each,
    never two to one (with two CPU hogs on the 2 cores, unbound threads that met on one core slowed one worker 1.5-8x
    for whole passes)."""
    meta, data = load_graph_json(inf_graph), load_graph_data(inf_graph)
    contents = timing_contents(meta, data.inputs, 1, Policy())
    w = proc.start_worker("timer", tmp_path, "cpu", (inf_graph,))
    try:
        w.request({"op": "load", "graph_dir": str(inf_graph), "baseline": True, "device": "cpu"}, 600)
        f = w.dir / "contents.pt"
        save_sets(f, contents, torch)
        w.request({"op": "pin", "cpus": timing.shared_cpus()}, 60)  # as the gate pins both timed workers
        w.request({"op": "time_setup", "sets_file": str(f), "roles": ["baseline"], "mode": "launch", "buffers": 4}, 120)
        timing.solo_ns(w, "baseline", 60)  # OpenMP's threads are started by now
        assert w.pid, "the worker said its pid"
        before = _threads(w.pid)
        for _ in range(20):  # calls enough for every thread that works in them to show CPU time
            timing.solo_ns(w, "baseline", 60)
        after = _threads(w.pid)
    finally:
        w.close()
    # The threads that ran the calls (the serving thread, OpenMP's first, and OpenMP's others; not the main thread,
    # which waits, nor any helper): each on one CPU, no two on one; the serving thread's pin to the shared CPUs left
    # it where OpenMP bound it.
    grew = {t: after[t][1] - before[t][1] for t in after if t in before}
    working = {t: after[t][0] for t, g in grew.items() if g * 10 >= max(grew.values())}
    assert len(working) >= 2 and all(m.isdigit() for m in working.values()), (before, after)
    assert len(set(working.values())) == len(working), (before, after)
