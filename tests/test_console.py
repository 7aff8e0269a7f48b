"""The CLI's one boundary (tilesmith_cli/console.py run_guarded) as a process: the exit status a shell sees."""

from __future__ import annotations

import os
import subprocess
import sys

# A command as `python -m` runs it, whose work is interrupted inside code exec() ran from a string, as a Ctrl-C
# lands in a dataclass's generated methods while torch imports (raised here rather than signalled: CPython marks
# the KeyboardInterrupt the same way, whatever raised it).
COMMAND = '''
import typer
from tilesmith_cli import console

app = typer.Typer()


@app.command()
def work() -> None:
    console.run_guarded(lambda: exec("raise KeyboardInterrupt"), resume=lambda: "carry on with this")


app()
'''


def test_ctrl_c_in_code_run_from_a_string_exits_130_under_python_m_not_by_sigint(tmp_path):
    """Unless the boundary clears CPython's mark, the process prints the message and then kills itself with SIGINT
    (status -2): seen in test_optimize's Ctrl-C test when the signal came while torch._inductor was imported."""
    (tmp_path / "interrupted_command.py").write_text(COMMAND)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    p = subprocess.run([sys.executable, "-m", "interrupted_command"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert p.returncode == 130, (p.returncode, p.stderr)
    assert "interrupted: what was confirmed is saved; `carry on with this` carries on" in p.stderr, p.stderr
