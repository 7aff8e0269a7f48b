"""The environment every worker starts with (tilesmith.sandbox.scrubbed_env): Inductor's CPU vector-ISA
probe is skipped in workers only where it cannot change what they pick."""

from __future__ import annotations

import subprocess
import sys

from tilesmith import sandbox

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
