"""The import paths that installed artifacts, candidates and users rely on still work after the code moved into
packages, and give the very objects the packages define: `from tilesmith.cudagraph import graphed`, `from
tilesmith.streams import side_by_side` (what an artifact imports; the static screen allows exactly these),
`import tilesmith.runtime` and `tilesmith.runtime.stats()`, `tilesmith.compile` and `tilesmith.last_run_id`; and the
modules tilesmith starts workers from by name (`python -m ...`) or by path are there."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_replay_paths_an_installed_artifact_imports_give_the_objects_of_tilesmith_replay():
    from tilesmith import cudagraph, streams
    from tilesmith.replay import graphed, streams as side

    assert cudagraph.graphed is graphed.graphed and cudagraph.Graphed is graphed.Graphed
    assert (cudagraph.MAX_RECORDS, cudagraph.MAX_LAYOUTS, cudagraph.ROTATE) == (graphed.MAX_RECORDS, graphed.MAX_LAYOUTS,
                                                                                graphed.ROTATE)
    assert cudagraph.MAX_GRAPH_BYTES == graphed.MAX_GRAPH_BYTES
    assert streams.side_by_side is side.side_by_side


def test_the_replay_paths_pass_the_static_screen_as_a_candidate_writes_them():
    from tilesmith.gate.static import screen

    text = ("def call(args):\n    return args\n\nfrom tilesmith.cudagraph import graphed\ncall = graphed(call)\n"
            "from tilesmith.streams import side_by_side\n")
    assert [f.code for f in screen(text)] == []


def test_the_user_entry_points_are_where_the_readme_says():
    import tilesmith
    import tilesmith.api
    import tilesmith.runtime

    assert tilesmith.compile is tilesmith.api.compile and tilesmith.last_run_id is tilesmith.api.last_run_id
    assert callable(tilesmith.runtime.stats)


def test_an_artifact_importing_the_old_replay_path_runs_in_a_fresh_interpreter():
    code = ("import torch\nfrom tilesmith.cudagraph import graphed\nfrom tilesmith.streams import side_by_side\n"
            "call = graphed(lambda args: [args[0] + 1])\n"
            "assert float(call([torch.zeros(2)])[0].sum()) == 2.0\n"
            "(a,), (b,) = side_by_side((lambda x: (x * 2,), (torch.ones(2),)), (lambda x: (x + 1,), (torch.ones(2),)))\n"
            "assert a.tolist() == [2.0, 2.0] and b.tolist() == [2.0, 2.0]\nprint('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


def test_every_module_tilesmith_starts_by_name_or_tells_the_agent_to_run_is_there():
    """`python -m NAME` in the library's code, its agent prompts and the shipped skills (workers, the zygote, the
    kernel bench), and the sandbox's stage, which runs by path."""
    texts = [f.read_text() for f in (ROOT / "tilesmith").rglob("*") if f.suffix in (".py", ".md")]
    names = {n for t in texts for n in re.findall(r'(?:"-m", "|python -m )(tilesmith\.[\w.]+)', t)}
    assert {"tilesmith.gate.worker", "tilesmith.launch.zygote", "tilesmith.profile.worker", "tilesmith.capture.rerun",
            "tilesmith.search.kernel_bench", "tilesmith.search.measure_worker", "tilesmith.search.relower_worker"} <= names
    for name in names:
        spec = importlib.util.find_spec(name)
        assert spec is not None and (spec.submodule_search_locations is None
                                     or importlib.util.find_spec(name + ".__main__") is not None), name
    from tilesmith.launch import sandbox

    argv = sandbox.wrap(["true"], sandbox.Spec(scratch=str(ROOT)), force=True)
    stage = Path(argv[argv.index("-I") + 1])
    assert stage.is_file() and stage.name == "stage.py", argv


def test_the_gate_worker_starts_by_its_module_name_and_answers():
    p = subprocess.run([sys.executable, "-c", (
        "import json, os, subprocess, sys\n"
        "r, w = os.pipe()\n"
        "p = subprocess.Popen([sys.executable, '-m', 'tilesmith.gate.worker', str(w)], stdin=subprocess.PIPE, "
        "pass_fds=(w,))\n"
        "os.close(w)\n"
        "p.stdin.write(b'{\"op\": \"ready\"}\\n{\"op\": \"exit\"}\\n'); p.stdin.close()\n"
        "print(os.read(r, 4096).decode().strip()); p.wait(timeout=120)\n")],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    reply = json.loads(p.stdout.strip().splitlines()[-1])
    assert p.returncode == 0 and reply["ok"] and reply["pid"] > 0, p.stderr[-2000:]
