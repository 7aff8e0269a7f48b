"""The agent's shell: the parent's environment (API keys) is withheld, a timeout kills the whole
process group, output is capped; the file tools stay inside the track folder."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest.importorskip("deepagents")

from tilesmith.search.agent.shell import GroupKillShellBackend, shell_env  # noqa: E402


def _running(marker: str) -> list[int]:
    """Processes (as this process sees them) whose command line holds `marker`: the shell runs in its own
    PID namespace, so the PIDs it sees are not ours; a unique argument finds its processes from here."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "status").read_text()
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError, PermissionError):
            continue
        if marker in cmd and "\nState:\tZ" not in state and str(os.getpid()) != d.name:
            found.append(int(d.name))
    return found


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
    r = sh.execute("sleep 61.25 & python -c 'import time; time.sleep(60)' marker-6125", timeout=2)
    assert time.monotonic() - t0 < 20
    assert r.exit_code == 124 and "timed out after 2 s" in r.output
    time.sleep(0.5)
    assert _running("61.25") == [] and _running("marker-6125") == []


def test_shell_kills_what_a_finished_command_left_running_and_caps_its_output(tmp_path):
    sh = GroupKillShellBackend(root_dir=tmp_path, virtual_mode=True, env=shell_env(tmp_path), max_output_bytes=1000)
    r = sh.execute("(sleep 62.25 > /dev/null 2>&1 &) ; sh -c 'echo $PPID' > /dev/null; "
                   "nohup sleep 62.5 > /dev/null 2>&1 & python -c \"print('x' * 50000 + 'END')\"")
    assert r.exit_code == 0 and r.truncated and len(r.output) < 1200 and r.output.rstrip().endswith("END")
    time.sleep(0.5)
    assert _running("62.25") == [] and _running("62.5") == []


def test_file_tools_are_fenced_to_the_track_folder(tmp_path):
    sh = GroupKillShellBackend(root_dir=tmp_path, virtual_mode=True, env=shell_env(tmp_path))
    (tmp_path / "a.py").write_text("x = 1\n")
    assert "x = 1" in str(sh.read("/a.py"))
    with pytest.raises(ValueError):
        sh.read("/../../etc/passwd")
    assert "not found" in str(sh.read("/etc/hostname")).lower() or not os.path.exists(tmp_path / "etc")


@pytest.mark.skipif(__import__("tilesmith.launch.sandbox", fromlist=["level"]).level() != "namespaces",
                    reason="needs user namespaces")
def test_sandboxed_shell_sees_only_its_own_processes_no_parent_environment_no_home_and_no_network(tmp_path):
    sh = GroupKillShellBackend(root_dir=tmp_path, virtual_mode=True, env=shell_env(tmp_path))
    home = Path.home()
    r = sh.execute(f"ls /proc | grep -c '^[0-9]'; cat /proc/$PPID/environ || echo no-parent; echo $(ls -A {home}); "
                   "echo x > ok.txt && echo wrote-track; echo x > /etc/tilesmith-probe || echo read-only; "
                   "python -c \"import socket; socket.create_connection(('1.1.1.1', 53), 2)\" 2>&1 | tail -1")
    lines = r.output.splitlines()
    assert int(lines[0]) <= 6  # the shell and its pipeline, not the machine's processes
    assert "no-parent" in r.output  # no parent process to read
    # The real home is hidden: what shows there is only what the interpreter and the compile caches
    # need, bound back.
    from tilesmith.launch.sandbox import _cache_dirs, _needed_paths

    needed = {Path(p).relative_to(home).parts[0] for p in _needed_paths() + _cache_dirs() if Path(p).is_relative_to(home)}
    assert set(lines[3].split()) <= needed
    assert "wrote-track" in r.output and (tmp_path / "ok.txt").exists() and "read-only" in r.output
    assert "unreachable" in r.output.lower()
