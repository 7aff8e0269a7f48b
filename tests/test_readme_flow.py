"""The README's Usage block, run the way a user types it: in a fresh folder, relative paths, the default
workspace and the default TILESMITH_HOME, the installed `tilesmith` command, one command after another.

The commands come from the README itself (its `## Usage` bash block), so the README and this test cannot
drift: a command the README stops showing, or one that stops working as shown, fails here. The agent's
flow with a relative `-w` is driven the same way, with a scripted model behind a local OpenAI-compatible
server.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, ROOT

README = ROOT / "README.md"
# What a user's train.py does here: the oversubscribed example (a genuine CPU win the tuner finds), with
# the `--epochs` option the README's commands pass.
TRAIN = (EXAMPLES / "oversubscribed.py").read_text().replace('"--steps"', '"--epochs"').replace("args.steps", "args.epochs")


def usage_lines() -> list[str]:
    """The README's Usage bash block, one command line each, comments dropped."""
    text = README.read_text()
    block = text[text.index("\n## Usage\n"):]
    block = block[block.index("```bash\n") + len("```bash\n"):]
    block = block[:block.index("```")]
    return [line for line in (re.sub(r"\s{2,}#.*$", "", raw).strip() for raw in block.splitlines()) if line]


def expand(line: str) -> list[str]:
    """The commands a README line stands for: `a | b` is two commands; `[--x]` options run without them,
    then with all of them; `KEY|--all` runs with each alternative in turn."""
    out = []
    for cmd in line.split(" | "):
        optional = re.findall(r"\[([^\]]+)\]", cmd)
        bare = re.sub(r"\s*\[[^\]]+\]", "", cmd)
        forms = [bare] + ([bare + " " + " ".join(optional)] if optional else [])
        for form in forms:
            alt = re.search(r"(\S+)\|(\S+)", form)
            out += [form.replace(alt.group(0), a) for a in alt.groups()] if alt else [form]
    return out


def _tilesmith() -> list[str]:
    exe = Path(sys.executable).with_name("tilesmith")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tilesmith_cli.app"]


def run_typed(command: str, cwd: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run one typed command line: leading VAR=value words set the environment, `tilesmith` and `python`
    are the installed ones."""
    words = shlex.split(command)
    env = dict(env)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    head = {"tilesmith": _tilesmith(), "python": [sys.executable]}.get(words[0], [words[0]])
    return subprocess.run(head + words[1:], cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout)


@pytest.fixture
def user_env(tmp_path, inductor_cache):
    """A user's shell: their own HOME (so the default TILESMITH_HOME is ~/.cache/tilesmith), no TILESMITH_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILESMITH_")}
    env.update(HOME=str(tmp_path / "user-home"), COLUMNS="200")
    (tmp_path / "user-home").mkdir()
    return env


def test_the_readme_usage_block_works_as_typed_from_a_fresh_folder(tmp_path, user_env):
    lines = usage_lines()
    commands = [c for line in lines for c in expand(line)]
    verbs = [_verb(c) for c in commands]
    assert {"capture", "replay", "optimize", "report", "install", "installed", "uninstall", "validate",
            "submit", "python"} <= set(verbs), lines
    cwd = tmp_path / "project"
    cwd.mkdir()
    (cwd / "train.py").write_text(TRAIN)
    home = Path(user_env["HOME"]) / ".cache" / "tilesmith"
    found: dict[str, str] = {}

    for typed in commands:
        cmd = typed
        for placeholder, value in (("<key>", "key"), ("<run-id>", "run_id"), ("KEY", "key"), ("CANDIDATE.py", "cand")):
            if placeholder in cmd:
                cmd = cmd.replace(placeholder, found[value])
        cmd = cmd.replace("GRAPH_DIR", f"tilesmith-workspace/graphs/{found.get('key', '')}")
        env = {**user_env, "TILESMITH_RUNTIME_VERBOSE": "1"} if "TILESMITH_RUNTIME=1" in cmd else user_env
        p = run_typed(cmd, cwd, env)
        out = p.stdout + p.stderr
        verb = _verb(cmd)
        if verb not in ("validate", "submit"):
            assert p.returncode == 0, f"$ {cmd}\n{out[-4000:]}"
        if verb == "capture":
            toml = cwd / "tilesmith-workspace" / "workspace.toml"
            assert toml.exists(), out
            from tilesmith import workspace as wsmod

            (g,) = [g for g in wsmod.load(cwd / "tilesmith-workspace").graphs if g.eligible]
            found["key"] = g.key
        elif verb == "replay":
            assert "match" in p.stdout, out
        elif verb == "optimize":
            found["run_id"] = re.search(r"tilesmith report (\S+)", p.stdout).group(1)
            _check_the_run_improved_a_graph_and_nothing_failed_to_load(home, found, cwd)
            shutil.copy(home / "runs" / found["run_id"] / found["key"] / "best.py", cwd / "candidate.py")
            found["cand"] = "candidate.py"
        elif verb == "report" and "--json" in cmd:
            assert json.loads(p.stdout)["run_id"] == found["run_id"]
            assert (cwd / "report.html").stat().st_size > 1000  # --html report.html, relative to the cwd
        elif verb == "python":
            assert f"tilesmith: {found['key'][:12]}: loaded the installed artifact" in p.stderr, out
        elif verb == "installed":
            assert found["key"][:12] in p.stdout, out
        elif verb == "uninstall":
            assert not list((home / "manifests").glob("*.json")), out
        elif verb in ("validate", "submit"):
            # The judged candidate is the run's accepted best: on a busy machine its timing may come out
            # too close to call, but it must load and be correct (the bug: every relative path failed at load).
            assert p.returncode == 0 or re.search(r"(REJECTED at|rejected at stage) (timing|confirmation)", out), \
                f"$ {cmd}\n{out[-4000:]}"


def _verb(command: str) -> str:
    words = [w for w in shlex.split(command) if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w)]
    return words[1] if words[0] == "tilesmith" else words[0]


def _check_the_run_improved_a_graph_and_nothing_failed_to_load(home: Path, found: dict, cwd: Path) -> None:
    rdir = home / "runs" / found["run_id"]
    run = json.loads((rdir / "run.json").read_text())
    assert run["workspace"] == str(cwd / "tilesmith-workspace")  # recorded absolute: `--resume` works from anywhere
    track = run["graphs"][found["key"]]
    assert track["loops_done"] >= 1 and track["speedup"] > 1, track
    verdicts = [json.loads(f.read_text()) for f in (rdir / found["key"] / "profiles").glob("verdict_*.json")]
    assert verdicts and not [v for v in verdicts if v["stage"] in ("static", "load") and not v["accepted"]], \
        [(v["stage"], v["reasons"]) for v in verdicts]
    variants = [json.loads(x) for x in (rdir / found["key"] / "profiles" / "tuner_variants.jsonl").read_text().splitlines()]
    assert {v["variant"] for v in variants} >= {"num_threads=1", "num_threads=2"}  # the tuner's search, screened
    assert "num_threads(" in (rdir / found["key"] / "best.py").read_text()


def test_the_agent_with_a_relative_workspace_gets_its_genuine_edit_accepted(tmp_path, user_env, two_matmuls_ws):
    pytest.importorskip("deepagents")
    from tests.agent_helpers import KERNEL_CALL, all_extern
    from tests.fakes.openai_stub import StubOpenAI

    cwd = tmp_path / "project"
    shutil.copytree(two_matmuls_ws, cwd / "ws")  # a copy: the session fixture stays as captured
    (gdir,) = (cwd / "ws" / "graphs").iterdir()
    text = (gdir / "wrapper.py").read_text()
    old = KERNEL_CALL.search(text).group(0)
    new = all_extern(old)  # the kernel call line -> two extern mm calls: a genuine win

    def route(body: dict) -> dict:
        msgs = body["messages"]
        last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
        content = msgs[last_user]["content"]
        content = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
        if sum(1 for m in msgs[last_user:] if m["role"] == "assistant"):
            return {"content": "Replaced the scalar loops by two extern mm calls."}
        attempt = re.findall(r"Current attempt: (/attempts/\S+?\.py)", content)[-1]
        return {"tool_calls": [("edit_file", {"file_path": attempt, "old_string": old, "new_string": new})]}

    stub = StubOpenAI(route, model="stub-model")
    try:
        env = {**user_env, "OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "sk-local-test"}
        # --no-warm-start: the agent's own edit is what this test judges (the tuner's warm start has its own test).
        p = run_typed("tilesmith optimize --optimizer agent --model stub-model --max-model-calls 4 --no-warm-start "
                      "-w ws", cwd, env)
    finally:
        stub.close()
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    rid = re.search(r"tilesmith report (\S+)", p.stdout).group(1)
    rdir = Path(user_env["HOME"]) / ".cache" / "tilesmith" / "runs" / rid
    track = json.loads((rdir / "run.json").read_text())["graphs"][gdir.name]
    verdicts = [json.loads(f.read_text()) for f in (rdir / gdir.name / "profiles").glob("verdict_*.json")]
    assert [v["stage"] for v in verdicts if not v["accepted"] and v["stage"] in ("static", "load")] == [], verdicts
    assert track["loops_done"] == 1, (track, [(v["stage"], v["reasons"]) for v in verdicts])


def test_errors_name_relative_paths_as_typed_and_workers_never_see_them(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from tilesmith import paths
    from tilesmith_cli.app import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ws" / "graphs" / "abc").mkdir(parents=True)
    (tmp_path / "cand.py").write_text("def call(args):\n    return []\n")
    r = CliRunner().invoke(app, ["validate", "ws/graphs/abc", "cand.py"])
    assert r.exit_code == 2 and "ws/graphs/abc is not a captured graph" in r.output and str(tmp_path) not in r.output
    r = CliRunner().invoke(app, ["optimize", "-w", "nowhere"])
    assert r.exit_code == 1 and "no workspace at nowhere" in r.output
    monkeypatch.setenv("TILESMITH_HOME", "rel-home")
    assert paths.home() == tmp_path / "rel-home" and paths.shown(tmp_path / "rel-home" / "x") == "rel-home/x"
