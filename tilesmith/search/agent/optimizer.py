"""The Deep Agent optimizer: per graph track, a LangChain Deep Agent plans 3-5 ideas per turn, works on
them in separate attempt files (itself and subagents, one file each), checks and screens them with the
fast tools (agent/inner.py), runs a shell with a per-kernel timing harness, and ends each turn with a
final answer; the host then judges the fastest screened attempt with the gate.

`run_track(track, settings, submit)` sets the track up (provider, skills, the tuner's warm start, the
agent) and runs its turns as a LangGraph loop (agent/loop.py): `submit` is the optimize driver's
judging function, the gate node calls it, and the verdict and the ledger are the next turn's message.
It returns the driver's (status, reason). Budgets: model calls (exact, shared with subagents) and
minutes per graph. Provider failures that survive the retries raise TilesmithError, which the driver
reports as the track's reason; confirmed wins are already on disk and stay.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
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
    attempts_per_turn: int = 3  # attempt files per turn: one per idea, each for its own worker
    screen_budget_s: float = 3.0  # timing seconds of one `screen` (all its files together)


@dataclass
class _TrackState:
    track: object
    attempt: Path | None = None  # the main agent's own file this turn (the first of `attempts`)
    evaluations: int = 0
    attempts: list = field(default_factory=list)  # this turn's attempt files
    turn: int = 0
    ledger: object = None  # agent_ledger.Ledger
    timing_lock: object = field(default_factory=threading.Lock)  # the driver's: measurements never overlap
    finished: str | None = None  # set by the `finish` tool: nothing more worth trying
    screen_budget_s: float = 3.0
    warm_note: str = ""  # what the tuner's warm start did, for the first turn's message


def builtin_skills_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "skills"


def run_track(track, settings, submit: Callable[[Candidate], dict], *, loops_done: int = 0,
              config: AgentConfig | None = None, timing_lock=None) -> tuple[str, str]:
    """Run the agent on one track until its loops are accepted, it finishes, or a budget ends it;
    return (status, reason). `timing_lock`: the driver's, held by every measurement."""
    from tilesmith.search.agent.ledger import Ledger

    cfg = config or AgentConfig()
    provider = check_provider(settings)  # a missing key or unknown model fails before any work
    skill_dirs = _skill_dirs(list(getattr(settings, "skills", None) or []) + cfg.extra_skills)
    model = chat_model(provider, reasoning_effort=getattr(settings, "reasoning_effort", None))
    window = context_window(model, getattr(settings, "context_window", None))
    minutes = getattr(settings, "graph_minutes", None)
    t_end = time.monotonic() + minutes * 60 if minutes else None

    def expired() -> bool:  # the run's limit or Ctrl-C, or this graph's own minutes
        return track.expired() or (t_end is not None and time.monotonic() > t_end)

    budget = ModelCallBudget(settings.max_model_calls or None, stop=expired)  # 0: unlimited; time up ends a turn
    # A screen is a cheaper look than a gate pass: never longer than the gate's timing budget.
    screen_s = min(cfg.screen_budget_s, settings.gate_time_budget_s or cfg.screen_budget_s)
    state = _TrackState(track, timing_lock=timing_lock or track.timing_lock, screen_budget_s=screen_s,
                        ledger=Ledger(track.profiles / "ledger.json"))
    state.attempts = [None] * cfg.attempts_per_turn  # sized for the prompt; the files come per turn
    (track.dir / "scratch").mkdir(parents=True, exist_ok=True)
    original = track.graph.wrapper
    (track.profiles / "original_wrapper.py").write_text(original)
    if getattr(settings, "warm_start", False) and not expired():
        from tilesmith.search.agent.warm import warm_start

        state.warm_note = warm_start(track, submit, expired, screen_budget_s=state.screen_budget_s)
    skills_root = Path(tempfile.mkdtemp(prefix="tilesmith-skills-"))
    try:
        names = _assemble_skills(skills_root, skill_dirs)
        agent = _build_agent(model, state, settings, budget, cfg, skills_root, names, provider.web_search, window)
        host = Host(agent, state, settings, budget, provider, submit, expired=expired, window=window)
        return run_loop(host, loops_done)
    finally:
        shutil.rmtree(skills_root, ignore_errors=True)


def context_window(model, tokens: int | None) -> int | None:
    """The model's input window in tokens: --context-window, else the model's own profile, else None
    (unknown: a large window is assumed). A given window becomes the model's profile, so deepagents'
    summarization starts at 85 % of it instead of its 170,000-token default."""
    if tokens:
        try:
            model.profile = {**(getattr(model, "profile", None) or {}), "max_input_tokens": int(tokens)}
        except Exception:  # a model class that refuses the attribute still gets the shorter prompt
            pass
        return int(tokens)
    prof = getattr(model, "profile", None) or {}
    return prof.get("max_input_tokens") if isinstance(prof.get("max_input_tokens"), int) else None


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
ONE attempt file: edit only that file. Read the kernel, try launch-parameter variants (block sizes,
num_warps, num_stages, thread counts) one at a time, pinned the way /skills/triton-performance shows
(`triton_heuristics.fixed_config`): `check` the file after each edit, `screen` it against the best, and
`python -m tilesmith.search.kernel_bench <file>` times each kernel on its real arguments. Leave the file
holding the best variant you measured (or as it was if nothing helped) and reply with what you tried,
the numbers, and what you kept."""

IMPLEMENTER_PROMPT = """You implement ONE optimization idea in ONE attempt file of a TorchInductor wrapper;
the task names both. Edit only that file (other workers own the other files). Read the skills that
apply (/skills/, with worked before/after rewrites that pass the gate). After each edit call `check`
on your file (load + correctness, seconds) and fix what it reports; then `screen` your file against the
best. `python -m tilesmith.search.kernel_bench <file>` (shell) times each kernel on its real arguments.
Stop when the idea works or is shown not to pay; leave the file holding your best correct version (or
restore the original text if nothing correct was faster) and reply with the file, the check result,
the screened ms against the best, and one line on why."""


def _build_agent(model, state: _TrackState, settings, budget, cfg: AgentConfig, skills_root: Path, skill_names,
                 web_search: bool = False, window: int | None = None):
    from deepagents import FilesystemPermission, create_deep_agent
    from deepagents.backends import CompositeBackend, FilesystemBackend
    from deepagents.middleware.subagents import GENERAL_PURPOSE_SUBAGENT
    from langchain.agents.middleware import TodoListMiddleware
    from langgraph.checkpoint.memory import InMemorySaver

    from tilesmith.search.agent.budget import BudgetMiddleware
    from tilesmith.search.agent.shell import GroupKillShellBackend, shell_env
    from tilesmith.search.agent.tools import make_tools, system_prompt

    tdir = state.track.dir
    shell = GroupKillShellBackend(root_dir=tdir, virtual_mode=True, inherit_env=False,
                                  env=shell_env(tdir, state.track.graph_dir), timeout=cfg.shell_timeout_s,
                                  max_output_bytes=shell_output_bytes(cfg.max_output_bytes, window),
                                  timing_lock=state.timing_lock)
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
    # The plan and the decision to stop are the main agent's: subagents get the measuring tools only.
    sub_tools = [t for t in tools if t.name not in ("ideas", "finish")]
    subagents = [
        {"name": "implementer", "description": "Implements one idea in one attempt file (name both in the task): "
         "edits only that file, checks and screens it, reports the screened ms against the best.",
         "system_prompt": IMPLEMENTER_PROMPT, "tools": sub_tools, "middleware": [gate], "skills": ["/skills/"],
         "permissions": perms},
        {"name": "kernel-tuner", "description": "Tunes one named kernel's launch parameters (block sizes, warps, "
         "stages, threads) in one attempt file (name both in the task); leaves the best variant in that file.",
         "system_prompt": KERNEL_TUNER_PROMPT, "tools": sub_tools, "middleware": [gate], "skills": ["/skills/"],
         "permissions": perms},
        {**GENERAL_PURPOSE_SUBAGENT, "middleware": [gate], "permissions": perms,
         "tools": sub_tools + ([dict(WEB_SEARCH_TOOL)] if web_search else [])},
    ]
    note = "\n## Skills available\n" + ", ".join(skill_names) if skill_names else ""
    # The provider's web search is a dict tool (the provider runs it; no tool node here): the main agent
    # gets it, and so does the general-purpose subagent (its tools above).
    main_tools = tools + ([dict(WEB_SEARCH_TOOL)] if web_search else [])
    return create_deep_agent(
        model=model, tools=main_tools,
        system_prompt=system_prompt(state, settings, note, web_search, fx_chars(window)),
        name="tilesmith-optimizer",
        middleware=[TodoListMiddleware(), gate], subagents=subagents, skills=["/skills/"], backend=backend,
        permissions=perms, checkpointer=InMemorySaver())


def fx_chars(window: int | None) -> int:
    """How much of the FX program the system prompt holds: ~10 % of a known window (4 characters a
    token), at most FX_CHARS."""
    from tilesmith.search.agent.tools import FX_CHARS

    return FX_CHARS if not window else max(1000, min(FX_CHARS, window * 4 // 10))


def shell_output_bytes(cap: int, window: int | None) -> int:
    """Shell output kept per call: ~10 % of a known window (4 characters a token), at most `cap`."""
    return cap if not window else max(2000, min(cap, window * 4 // 10))
