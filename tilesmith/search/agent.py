"""The Deep Agent optimizer: per graph track, a LangChain Deep Agent edits an attempt of the wrapper,
runs a shell, profiles, calls the gate through `evaluate`, delegates to subagents, and ends each turn
with a final answer; the host gate (the optimize driver) then judges the attempt.

`search(track, settings)` is a generator like the tuner's: it yields one Candidate per agent turn
(its `path` is the attempt already in the ring) and receives the host verdict (dict) through send();
a rejected verdict is the next turn's message. The conversation persists across turns (checkpointer,
one thread per track). Returning means the optimizer has nothing more (budget spent, time up, or the
agent stopped proposing changes). Provider failures that survive the retries raise TilesmithError,
which the driver reports as the track's reason; confirmed wins are already on disk and stay.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generator

from tilesmith import runs
from tilesmith.errors import TilesmithError
from tilesmith.search.agent_budget import BLOCKED_PREFIX, BudgetExhausted, ModelCallBudget, SummaryBudgetCallback
from tilesmith.search.agent_provider import Provider, chat_model, check_provider
from tilesmith.search.tuner import Candidate
from tilesmith.workspace import write_json

__all__ = ["search", "check_provider", "AgentConfig", "builtin_skills_dir"]

RECURSION_LIMIT = 10**9  # no hidden step cap: the model-call budget is the bound
MAX_IDLE_TURNS = 3  # turns in a row that end without changing the attempt before we give up


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
    return Path(__file__).resolve().parent.parent / "skills"


def search(track, settings, config: AgentConfig | None = None) -> Generator[Candidate, dict, None]:
    """Yield one candidate per agent turn; receive the host gate's verdict (dict) for each."""
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
        agent = _build_agent(model, state, settings, budget, cfg, skills_root, names)
        yield from _turns(agent, state, settings, budget, provider)
    finally:
        shutil.rmtree(skills_root, ignore_errors=True)


def _turns(agent, state: _TrackState, settings, budget: ModelCallBudget, provider: Provider):
    from langchain_core.messages import HumanMessage

    track = state.track
    last_text = track.best_text  # the source most recently judged by the host (or the starting point)
    feedback, accepted, idle = None, 0, 0
    turn = len(list(track.profiles.glob("turn_*.json")))
    while True:
        if track.expired() or budget.exhausted:
            return
        turn += 1
        state.attempt = runs.push_attempt(track.run_id, track.key, last_text)
        msg = _turn_message(state, settings, budget, accepted, feedback)
        trace_cb = _trace()
        used_before, error, final = budget.used, None, ""
        try:
            out = agent.invoke({"messages": [HumanMessage(msg)]},
                               config={"configurable": {"thread_id": f"track-{track.key}"},
                                       "callbacks": [trace_cb, SummaryBudgetCallback(budget)],
                                       "recursion_limit": RECURSION_LIMIT})
            final = _text(out["messages"][-1].content) if out.get("messages") else ""
        except BudgetExhausted as e:
            final = f"{BLOCKED_PREFIX} {e}"
        except Exception as e:  # the provider (after its retries) or the agent stack failed
            error = e
        if not state.attempt.exists():  # the agent deleted its attempt: judge nothing, restore next turn
            state.attempt.write_text(last_text)
        text = state.attempt.read_text()
        _save_trace(track, turn, accepted + 1, state, budget, used_before, trace_cb, msg, final, error, text != last_text)
        if error is not None:
            raise TilesmithError(_error_reason(error, provider), code="provider-error",
                                 hint="check the provider and the model; confirmed wins of this run are kept") from None
        if text == last_text:
            idle += 1
            if budget.exhausted or idle >= MAX_IDLE_TURNS:
                return
            feedback = ("Your turn ended but the current attempt is unchanged, so there was nothing to judge. "
                        "Edit the attempt file, check it with `evaluate`, then answer.")
            continue
        idle = 0
        guard_best(track)
        verdict = yield Candidate(text, f"agent turn {turn}: {final.strip()[:100]}", state.attempt)
        last_text = text
        if verdict and verdict.get("accepted"):
            accepted += 1
        feedback = _verdict_message(verdict or {})
        if budget.exhausted:
            return


def guard_best(track) -> bool:
    """The shell is not a sandbox: it could rewrite /best.py, the gate's timing baseline, to make the
    next candidate look fast. Put back the source the host confirmed; True if it had changed."""
    best = track.dir / "best.py"
    if best.exists() and best.read_text() != track.best_text:
        from tilesmith.workspace import atomic_write_text

        atomic_write_text(best, track.best_text)
        track.record({"event": "best.py restored: changed outside the host"})
        return True
    return False


def _turn_message(state: _TrackState, settings, budget: ModelCallBudget, accepted: int, feedback: str | None) -> str:
    name = f"/attempts/{state.attempt.name}"
    best = "/best.py (the best confirmed source)" if (state.track.dir / "best.py").exists() else "the original wrapper"
    left = "unlimited" if budget.limit is None else f"{budget.remaining} of {budget.limit}"
    head = (f"Loop {accepted + 1} of {settings.loops}. Current attempt: {name} (a copy of the source the host judged "
            f"last). To be accepted it must beat {best} by at least {settings.min_improvement:.1%}. "
            f"Model calls left: {left}.")
    return f"{feedback}\n\n{head}" if feedback else head + " Start by reading the skills that apply and profiling."


def _verdict_message(vd: dict) -> str:
    from tilesmith.search.agent_tools import _compact_verdict

    tm = (vd.get("confirmation") or vd.get("first") or {}).get("timing") or {}
    if vd.get("accepted"):
        return (f"The host gate ACCEPTED your candidate: speedup {tm.get('speedup', 0):.3f}x "
                f"(lower bound {tm.get('speedup_low', 0):.3f}x) over the previous best. It is now /best.py. "
                f"Find a further, different improvement on top of it.")
    reasons = "; ".join(f"{r.get('code')}: {r.get('message')}" for r in vd.get("reasons", []))
    return (f"The host gate REJECTED your candidate at stage '{vd.get('stage')}': {reasons}\n"
            f"Verdict: {json.dumps(_compact_verdict(vd))[:6000]}\nFix it or try another idea.")


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


def _error_reason(e: Exception, p: Provider) -> str:
    where = f"{p.kind} model '{p.model}'" + (f" at {p.base_url}" if p.base_url else "")
    return f"the {where} failed after retries: {type(e).__name__}: {str(e)[:300]}"


def _trace():
    from tilesmith.search.agent_trace import TurnTrace

    return TurnTrace()


def _save_trace(track, turn, loop, state, budget, used_before, trace_cb, msg, final, error, changed) -> None:
    write_json(track.profiles / f"turn_{turn:03d}.json", {
        "turn": turn, "loop": loop, "attempt": f"attempts/{state.attempt.name}", "attempt_changed": changed,
        "message": msg, "final_answer": final, "error": None if error is None else f"{type(error).__name__}: {error}"[:2000],
        "budget": {"limit": budget.limit, "used": budget.used, "this_turn": budget.used - used_before,
                   "blocked": budget.blocked, "by_agent": dict(budget.by_agent)},
        **trace_cb.summary(), "events": trace_cb.events})


# -- skills ----------------------------------------------------------------------------------------
def _skill_dirs(extra: list[str]) -> list[Path]:
    dirs = [builtin_skills_dir()]
    for d in extra:
        p = Path(d).expanduser()
        if not p.is_dir():
            raise TilesmithError(f"skills folder {p} does not exist", code="usage",
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


def _build_agent(model, state: _TrackState, settings, budget, cfg: AgentConfig, skills_root: Path, skill_names):
    from deepagents import FilesystemPermission, create_deep_agent
    from deepagents.backends import CompositeBackend, FilesystemBackend
    from deepagents.middleware.subagents import GENERAL_PURPOSE_SUBAGENT
    from langchain.agents.middleware import TodoListMiddleware
    from langgraph.checkpoint.memory import InMemorySaver

    from tilesmith.search.agent_budget import BudgetMiddleware
    from tilesmith.search.agent_shell import GroupKillShellBackend, shell_env
    from tilesmith.search.agent_tools import make_tools, system_prompt

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
    return create_deep_agent(
        model=model, tools=tools, system_prompt=system_prompt(state, settings, note), name="tilesmith-optimizer",
        middleware=[TodoListMiddleware(), gate], subagents=subagents, skills=["/skills/"], backend=backend,
        permissions=perms, checkpointer=InMemorySaver())
