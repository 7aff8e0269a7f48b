"""The outer loop of one agent track, a LangGraph StateGraph:

    START -> decide -> agent_turn --changed--> gate -> decide -> agent_turn -> ... -> decide -> END
                           `--unchanged--> decide

- agent_turn: one Deep Agent turn on the current attempt; the agent's final answer ends it. The
  conversation persists across turns (the agent's own checkpointer, one thread per track). Its trace
  (model calls, tool calls, tokens, timings) goes to profiles/turn_NNN.json.
- gate: the host gate judges the attempt. `Host.submit` is the optimize driver's judging function
  (judge with a confirmation pass, record the verdict, make an accepted source the best so far).
- decide: counts accepted loops, writes the next turn's message (the verdict, or a nudge when the
  attempt is unchanged) and routes: another turn, or END when `loops` are accepted, the time is up
  (--max-minutes or Ctrl-C), the model-call budget is spent, or the agent stopped changing its attempt.

Every node appends one line to profiles/loop.jsonl (the track's node sequence and each route taken).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Callable, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from tilesmith import runs
from tilesmith.errors import TilesmithError
from tilesmith.search.agent_budget import BLOCKED_PREFIX, BudgetExhausted, ModelCallBudget, SummaryBudgetCallback
from tilesmith.search.agent_provider import Provider
from tilesmith.search.tuner import Candidate
from tilesmith.sandbox import redact
from tilesmith.workspace import write_json

RECURSION_LIMIT = 10**9  # no hidden step cap, inside a turn or across turns: the budget is the bound
MAX_IDLE_TURNS = 3  # turns in a row that end without changing the attempt before we give up

# decide's routes that end the track, with the driver's (status, reason); the others (start, accepted,
# rejected, unchanged) say why another turn follows.
ENDINGS = {"loops_reached": ("done", ""),
           "time_up": ("interrupted", "the time for this graph is up or the run was interrupted"),
           "budget_spent": ("exhausted", "the model-call budget is spent"),
           "agent_idle": ("exhausted", f"the agent ended {MAX_IDLE_TURNS} turns in a row without changing its attempt")}


class LoopState(TypedDict):
    turn: int  # agent turns on this track so far (a resumed track continues its numbering)
    accepted: int  # loops accepted so far (the driver's loops_done)
    idle: int  # turns in a row that ended with the attempt unchanged
    last_text: str  # the source judged last, or the starting point: each turn's attempt starts from it
    changed: bool  # the last turn left a different attempt
    final: str  # the last turn's final answer
    verdict: dict | None  # the host verdict on the last turn's attempt (None: nothing judged since)
    feedback: str | None  # what the next turn's message starts with
    route: str  # decide's choice: why another turn follows, or how the track ends (ENDINGS)


@dataclass
class Host:
    """What the nodes use besides the state: the LangGraph context of one track's run."""

    agent: object  # the compiled Deep Agent
    state: object  # agent._TrackState: the track, the current attempt
    settings: object
    budget: ModelCallBudget
    provider: Provider
    submit: Callable[[Candidate], dict]  # the driver's judge-and-record; returns the verdict dict


def run_loop(host: Host, loops_done: int = 0) -> tuple[str, str]:
    """Run the track's turns; return the driver's (status, reason): done, interrupted or exhausted."""
    track = host.state.track
    start: LoopState = {"turn": len(list(track.profiles.glob("turn_*.json"))), "accepted": loops_done, "idle": 0,
                        "last_text": track.best_text, "changed": False, "final": "", "verdict": None,
                        "feedback": None, "route": ""}
    out = loop_graph().invoke(start, {"recursion_limit": RECURSION_LIMIT}, context=host)
    return ENDINGS[out["route"]]


@functools.cache
def loop_graph():
    """The compiled outer loop (the same for every track; the track comes in as context)."""
    g = StateGraph(LoopState, context_schema=Host)
    g.add_node("decide", decide)
    g.add_node("agent_turn", agent_turn)
    g.add_node("gate", gate)
    g.add_edge(START, "decide")
    g.add_conditional_edges("decide", _after_decide, {"next_turn": "agent_turn", "end": END})
    g.add_conditional_edges("agent_turn", _after_turn, {"changed": "gate", "unchanged": "decide"})
    g.add_edge("gate", "decide")
    return g.compile(name="tilesmith-track-loop")


def _after_decide(s: LoopState) -> str:
    return "end" if s["route"] in ENDINGS else "next_turn"


def _after_turn(s: LoopState) -> str:
    return "changed" if s["changed"] else "unchanged"


# -- nodes -----------------------------------------------------------------------------------------
def decide(s: LoopState, runtime: Runtime[Host]) -> dict:
    """Take in the last turn's outcome and choose: another turn, or the end of the track."""
    host = runtime.context
    accepted, idle, feedback, vd = s["accepted"], s["idle"], s["feedback"], s["verdict"]
    if vd is not None:  # the gate judged the last turn's attempt
        accepted += bool(vd.get("accepted"))
        idle, feedback, why = 0, _verdict_message(vd), "accepted" if vd.get("accepted") else "rejected"
    elif s["route"]:  # a turn ran and left the attempt unchanged
        idle += 1
        feedback = ("Your turn ended but the current attempt is unchanged, so there was nothing to judge. "
                    "Edit the attempt file, check it with `evaluate`, then answer.")
        why = "unchanged"
    else:
        why = "start"
    if accepted >= host.settings.loops:
        route = "loops_reached"
    elif host.state.track.expired():
        route = "time_up"
    elif host.budget.exhausted:
        route = "budget_spent"
    elif idle >= MAX_IDLE_TURNS:
        route = "agent_idle"
    else:
        route = why
    _log(host, "decide", s["turn"], route=route, accepted=accepted)
    return {"accepted": accepted, "idle": idle, "feedback": feedback, "verdict": None, "route": route}


def agent_turn(s: LoopState, runtime: Runtime[Host]) -> dict:
    """One agent turn on a fresh attempt (a copy of the source judged last), to its final answer."""
    from langchain_core.messages import HumanMessage

    from tilesmith.search.agent_trace import TurnTrace

    host = runtime.context
    state, track, budget = host.state, host.state.track, host.budget
    turn = s["turn"] + 1
    state.attempt = runs.push_attempt(track.run_id, track.key, s["last_text"])
    msg = _turn_message(state, host.settings, budget, s["accepted"], s["feedback"])
    trace = TurnTrace()
    used_before, error, final = budget.used, None, ""
    try:
        out = host.agent.invoke({"messages": [HumanMessage(msg)]},
                                config={"configurable": {"thread_id": f"track-{track.key}"},
                                        "callbacks": [trace, SummaryBudgetCallback(budget)],
                                        "recursion_limit": RECURSION_LIMIT})
        final = _text(out["messages"][-1].content) if out.get("messages") else ""
    except BudgetExhausted as e:
        final = f"{BLOCKED_PREFIX} {e}"
    except Exception as e:  # the provider (after its retries) or the agent stack failed
        error = e
    if not state.attempt.exists():  # the agent deleted its attempt: judge nothing, restore next turn
        state.attempt.write_text(s["last_text"])
    changed = state.attempt.read_text() != s["last_text"]
    _save_trace(track, turn, s["accepted"] + 1, state, budget, used_before, trace, msg, final, error, changed)
    _log(host, "agent_turn", turn, attempt=state.attempt.name, changed=changed, model_calls=budget.used - used_before,
         error=None if error is None else type(error).__name__)
    if error is not None:
        raise TilesmithError(_error_reason(error, host.provider), code="provider-error",
                             hint="check the provider and the model; confirmed wins of this run are kept") from None
    return {"turn": turn, "changed": changed, "final": final}


def gate(s: LoopState, runtime: Runtime[Host]) -> dict:
    """The host gate judges the attempt the turn left (through the driver, which records the verdict)."""
    host = runtime.context
    track = host.state.track
    guard_best(track)
    text = host.state.attempt.read_text()
    vd = host.submit(Candidate(text, f"agent turn {s['turn']}: {s['final'].strip()[:100]}", host.state.attempt))
    _log(host, "gate", s["turn"], accepted=bool(vd.get("accepted")), stage=vd.get("stage"))
    return {"verdict": vd, "last_text": text}


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


# -- messages and traces ---------------------------------------------------------------------------
def _turn_message(state, settings, budget: ModelCallBudget, accepted: int, feedback: str | None) -> str:
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


def _log(host: Host, node: str, turn: int, **fields) -> None:
    with (host.state.track.profiles / "loop.jsonl").open("a") as f:
        f.write(redact(json.dumps({"t": runs.now_iso(), "node": node, "turn": turn, **fields})) + "\n")


def _save_trace(track, turn, loop, state, budget, used_before, trace, msg, final, error, changed) -> None:
    write_json(track.profiles / f"turn_{turn:03d}.json", {
        "turn": turn, "loop": loop, "attempt": f"attempts/{state.attempt.name}", "attempt_changed": changed,
        "message": msg, "final_answer": final, "error": None if error is None else f"{type(error).__name__}: {error}"[:2000],
        "budget": {"limit": budget.limit, "used": budget.used, "this_turn": budget.used - used_before,
                   "blocked": budget.blocked, "by_agent": dict(budget.by_agent)},
        **trace.summary(), "events": trace.events})
