"""The environment every worker starts with (tilesmith.launch.sandbox.scrubbed_env): Inductor's CPU vector-ISA
probe is skipped in workers only where it cannot change what they pick."""

from __future__ import annotations

import subprocess
import sys

from tilesmith.launch import sandbox

PICK = "from torch._inductor import cpu_vec_isa; print(str(cpu_vec_isa.pick_vec_isa()))"


def test_workers_skip_the_isa_probe_only_where_they_pick_what_the_probe_picks(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_VEC_ISA_OK", raising=False)
    env = sandbox.scrubbed_env(tmp_path)
    probed = subprocess.run([sys.executable, "-c", PICK], capture_output=True, text=True, check=True,
                            env={**env, "TORCHINDUCTOR_VEC_ISA_OK": ""}).stdout.strip()
    if sandbox.vec_isa_settled():
        assert env["TORCHINDUCTOR_VEC_ISA_OK"] == "1"
    else:  # the flags offer an ISA this machine cannot build: workers probe as before
        assert "TORCHINDUCTOR_VEC_ISA_OK" not in env
    worker = subprocess.run([sys.executable, "-c", PICK], capture_output=True, text=True, check=True, env=env)
    assert worker.stdout.strip() == probed and probed  # the same pick, probe or no probe


def test_a_users_own_isa_setting_reaches_the_workers_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_VEC_ISA_OK", "0")
    assert sandbox.scrubbed_env(tmp_path)["TORCHINDUCTOR_VEC_ISA_OK"] == "0"


def test_workers_that_run_no_cpu_graph_never_wait_for_the_isa_probe(tmp_path, monkeypatch):
    """The probe builds a C++ program per ISA in the deciding process (a minute on a cold H200 host, spent
    before a CUDA graph's first profile): the environment of a worker that runs no graph on the CPU, and
    the sandbox's own probe, never ask for it."""
    monkeypatch.delenv("TORCHINDUCTOR_VEC_ISA_OK", raising=False)
    asked = []
    monkeypatch.setattr(sandbox, "vec_isa_settled", lambda: asked.append(1) or True)
    from tilesmith.gate.proc import worker_env

    assert "TORCHINDUCTOR_VEC_ISA_OK" not in worker_env(tmp_path, "cuda:0")
    assert "TORCHINDUCTOR_VEC_ISA_OK" not in sandbox.scrubbed_env(tmp_path, cpu_kernels=False)
    spec = sandbox.Spec(scratch=str(tmp_path), devices=sandbox.devices_for("cuda"))
    res = sandbox.run_json([sys.executable, "-c", "import json, os; print(json.dumps({'isa': os.environ.get('TORCHINDUCTOR_VEC_ISA_OK')}))"],
                           spec, 60)
    assert res.reply == {"isa": None} and res.spawned > 0 and not asked
    assert worker_env(tmp_path, "cpu")["TORCHINDUCTOR_VEC_ISA_OK"] == "1" and asked  # a CPU worker's still does
