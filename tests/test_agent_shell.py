"""The agent's shell: the parent's environment (API keys) is withheld, a timeout kills the whole
process group, output is capped; the file tools stay inside the track folder."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest.importorskip("deepagents")

from tilesmith.search.agent.shell import GroupKillShellBackend, shell_env  # noqa: E402


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state  # a zombie is dead, only not yet reaped


def test_shell_cannot_see_the_parents_api_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-parent-secret")
    monkeypatch.setenv("OPENROUTER_API_KEY", "or-parent-secret")
    sh = GroupKillShellBackend(root_dir=tmp_path, virtual_mode=True, env=shell_env(tmp_path))
    r = sh.execute("env; python -c \"import os; print('py-key', os.environ.get('OPENAI_API_KEY'))\"")
    assert r.exit_code == 0
    assert "secret" not in r.output and "OPENAI_API_KEY" not in r.output.replace("get('OPENAI_API_KEY')", "")
    assert "py-key None" in r.output and f"PWD={tmp_path}" in r.output
    assert f"HOME={tmp_path / 'scratch' / 'home'}" in r.output


def test_shell_timeout_kills_the_whole_process_group(tmp_path):
    sh = GroupKillShellBackend(root_dir=tmp_path, virtual_mode=True, env=shell_env(tmp_path))
    t0 = time.monotonic()
    r = sh.execute("sleep 60 & echo $! > bg.pid; python -c 'import os, time; print(os.getpid(), flush=True); "
                   "open(\"py.pid\", \"w\").write(str(os.getpid())); time.sleep(60)'", timeout=2)
    assert time.monotonic() - t0 < 20
    assert r.exit_code == 124 and "timed out after 2 s" in r.output
    time.sleep(0.5)
    pids = [int((tmp_path / f).read_text()) for f in ("bg.pid", "py.pid")]
    assert not any(_alive(p) for p in pids), pids


def test_shell_kills_what_a_finished_command_left_running_and_caps_its_output(tmp_path):
    sh = GroupKillShellBackend(root_dir=tmp_path, virtual_mode=True, env=shell_env(tmp_path), max_output_bytes=1000)
    r = sh.execute("(sleep 60 > /dev/null 2>&1 &) ; sh -c 'echo $PPID' > /dev/null; "
                   "nohup sleep 60 > /dev/null 2>&1 & echo $! > bg.pid; python -c \"print('x' * 50000 + 'END')\"")
    assert r.exit_code == 0 and r.truncated and len(r.output) < 1200 and r.output.rstrip().endswith("END")
    time.sleep(0.5)
    assert not _alive(int((tmp_path / "bg.pid").read_text()))


def test_file_tools_are_fenced_to_the_track_folder(tmp_path):
    sh = GroupKillShellBackend(root_dir=tmp_path, virtual_mode=True, env=shell_env(tmp_path))
    (tmp_path / "a.py").write_text("x = 1\n")
    assert "x = 1" in str(sh.read("/a.py"))
    with pytest.raises(ValueError):
        sh.read("/../../etc/passwd")
    assert "not found" in str(sh.read("/etc/hostname")).lower() or not os.path.exists(tmp_path / "etc")
