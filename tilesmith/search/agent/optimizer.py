"""The Deep Agent optimizer: per graph track, a LangChain Deep Agent edits an attempt of the wrapper,
runs a shell, profiles, calls the gate through `evaluate`, delegates to subagents, and ends each turn
with a final answer; the host gate then judges the attempt.

`run_track(track, settings, submit)` sets the track up (provider, skills, the agent) and runs its turns
as a LangGraph loop (loop.py): `submit` is the optimize driver's judging function, the gate node
calls it, and a rejected verdict is the next turn's message. It returns the driver's (status, reason).
Provider failures that survive the retries raise TilesmithError, which the driver reports as the
track's reason; confirmed wins are already on disk and stay.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tilesmith import paths
from tilesmith.errors import TilesmithError
from tilesmith.search.agent.budget import ModelCallBudget
from tilesmith.search.agent.loop import RECURSION_LIMIT, Host, run_loop
from tilesmith.search.agent.provider import WEB_SEARCH_TOOL, chat_model, check_provider
from tilesmith.search import Candidate

__all__ = ["run_track", "check_provider", "AgentConfig", "builtin_skills_dir", "RECURSION_LIMIT"]


@dataclass
class AgentConfig:
    shell_timeout_s: int = 600  # default per `execute`; the model may ask for less or more (capped below)
    max_output_bytes: int = 30_000  # shell output kept per call (the end of it)
    extra_skills: list[str] = field(default_factory=list)


@dataclass
class _TrackState:
    track: object
    attempt: Path | None = None
    evaluations: int = 0


def builtin_skills_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "skills"


def run_track(track, settings, submit: Callable[[Candidate], dict], *, loops_done: int = 0,
              config: AgentConfig | None = None) -> tuple[str, str]:
    """Run the agent on one track until its loops are accepted or it stops; return (status, reason)."""
    cfg = config or AgentConfig()
    provider = check_provider(settings)  # a missing key or unknown model fails before any work
    skill_dirs = _skill_dirs(list(getattr(settings, "skills", None) or []) + cfg.extra_skills)
    model = chat_model(provider)
    budget = ModelCallBudget(settings.max_model_calls, stop=track.expired)  # time up ends a turn promptly
    state = _TrackState(track)
    (track.dir / "scratch").mkdir(parents=True, exist_ok=True)
    original = (track.graph_dir / "wrapper.py").read_text()
    (track.profiles / "original_wrapper.py").write_text(original)
    skills_root = Path(tempfile.mkdtemp(prefix="tilesmith-skills-"))
    try:
        names = _assemble_skills(skills_root, skill_dirs)
        agent = _build_agent(model, state, settings, budget, cfg, skills_root, names, provider.web_search)
        return run_loop(Host(agent, state, settings, budget, provider, submit), loops_done)
    finally:
        shutil.rmtree(skills_root, ignore_errors=True)


# -- skills ----------------------------------------------------------------------------------------
def _skill_dirs(extra: list[str]) -> list[Path]:
    dirs = [builtin_skills_dir()]
    for d in extra:
        p = paths.absolute(d)
        if not p.is_dir():
            raise TilesmithError(f"skills folder {paths.shown(p)} does not exist", code="usage",
                                 hint="--skills takes a folder holding SKILL.md, or a folder of such folders")
        dirs.append(p)
    return dirs


def _assemble_skills(root: Path, dirs: list[Path]) -> list[str]:
    """Copy every skill (a folder with SKILL.md) into one read-only mount; later folders override."""
    for d in dirs:
        for sk in ([d] if (d / "SKILL.md").is_file() else sorted(x for x in d.iterdir() if (x / "SKILL.md").is_file())):
            shutil.rmtree(root / sk.name, ignore_errors=True)
            shutil.copytree(sk, root / sk.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return sorted(p.name for p in root.iterdir())


# -- the agent -------------------------------------------------------------------------------------
KERNEL_TUNER_PROMPT = """You tune one kernel of a TorchInductor wrapper. You get a task naming the kernel and
the attempt file. Read the kernel, try launch-parameter variants (block sizes, num_warps, num_stages,
thread counts, vectorization) one at a time: write microbenchmarks under /scratch and run them with
`execute`, or edit the attempt and call `evaluate`. Leave the attempt holding the best variant you
measured (or unchanged if nothing helped) and reply with what you tried, the numbers, and what you kept."""


def _build_agent(model, state: _TrackState, settings, budget, cfg: AgentConfig, skills_root: Path, skill_names,
                 web_search: bool = False):
    from deepagents import FilesystemPermission, create_deep_agent
    from deepagents.backends import CompositeBackend, FilesystemBackend
    from deepagents.middleware.subagents import GENERAL_PURPOSE_SUBAGENT
    from langchain.agents.middleware import TodoListMiddleware
    from langgraph.checkpoint.memory import InMemorySaver

    from tilesmith.search.agent.budget import BudgetMiddleware
    from tilesmith.search.agent.shell import GroupKillShellBackend, shell_env
    from tilesmith.search.agent.tools import make_tools, system_prompt

    tdir = state.track.dir
    shell = GroupKillShellBackend(root_dir=tdir, virtual_mode=True, inherit_env=False, env=shell_env(tdir),
                                  timeout=cfg.shell_timeout_s, max_output_bytes=cfg.max_output_bytes)
    scratch = tdir / "scratch"
    for sub in ("large_tool_results", "conversation_history"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    backend = CompositeBackend(default=shell, routes={
        "/skills/": FilesystemBackend(root_dir=skills_root, virtual_mode=True),
        "/profiles/": FilesystemBackend(root_dir=state.track.profiles, virtual_mode=True),
        "/large_tool_results/": FilesystemBackend(root_dir=scratch / "large_tool_results", virtual_mode=True),
        "/conversation_history/": FilesystemBackend(root_dir=scratch / "conversation_history", virtual_mode=True)})
    perms = [FilesystemPermission(operations=["write"], paths=["/skills/**", "/profiles/**"], mode="deny")]
    gate = BudgetMiddleware(budget)  # the same instance in every stack: one shared count
    tools = make_tools(state, settings)
    subagents = [
        {"name": "kernel-tuner", "description": "Tunes one named kernel's launch parameters (block sizes, warps, "
         "stages, threads) with microbenchmarks and evaluate; leaves the best variant in the attempt.",
         "system_prompt": KERNEL_TUNER_PROMPT, "tools": tools, "middleware": [gate], "skills": ["/skills/"],
         "permissions": perms},
        {**GENERAL_PURPOSE_SUBAGENT, "middleware": [gate], "permissions": perms},
    ]
    note = "\n## Skills available\n" + ", ".join(skill_names) if skill_names else ""
    # The provider's web search is a dict tool (the provider runs it; no tool node here): the main agent
    # gets it, and so does the general-purpose subagent, which inherits the main agent's tools.
    main_tools = tools + ([dict(WEB_SEARCH_TOOL)] if web_search else [])
    return create_deep_agent(
        model=model, tools=main_tools, system_prompt=system_prompt(state, settings, note, web_search),
        name="tilesmith-optimizer",
        middleware=[TodoListMiddleware(), gate], subagents=subagents, skills=["/skills/"], backend=backend,
        permissions=perms, checkpointer=InMemorySaver())
