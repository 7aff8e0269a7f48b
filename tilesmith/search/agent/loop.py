"""The outer loop of one agent track, a LangGraph StateGraph:

    START -> decide -> agent_turn --changed--> gate -> decide -> agent_turn -> ... -> decide -> END
                           `--unchanged--> decide

- agent_turn: one Deep Agent turn on this turn's attempt files (agent_ledger.turn_attempts: copies of
  the best accepted source, one per idea and worker); the agent's final answer ends it. The host then
  picks what the gate judges: of the files the turn changed and whose last check did not fail, the
  fastest in one interleaved screen. The conversation persists across turns (the agent's own
  checkpointer, one thread per track). Its trace goes to profiles/turn_NNN.json.
- gate: the host gate judges the chosen attempt. `Host.submit` is the optimize driver's judging
  function (judge with a confirmation pass, record the verdict, make an accepted source the best).
- decide: counts accepted loops, writes the next turn's message (the verdict and the ledger) and
  routes: another turn, or END when `loops` are accepted, the agent called `finish`, the time is up
  (--max-minutes, --graph-minutes or Ctrl-C), the model-call budget is spent, or the agent ended
  several turns in a row without a file to judge.

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
from tilesmith.search.agent.budget import BLOCKED_PREFIX, BudgetExhausted, ModelCallBudget, SummaryBudgetCallback
from tilesmith.search.agent.provider import Provider
from tilesmith.search import Candidate
from tilesmith.launch.secrets import redact
from tilesmith.workspace import write_json

RECURSION_LIMIT = 10**9  # no hidden step cap, inside a turn or across turns: the budget is the bound
MAX_IDLE_TURNS = 3  # turns in a row that end without changing the attempt before we give up

# decide's routes that end the track, with the driver's (status, reason); the others (start, accepted,
# rejected, unchanged) say why another turn follows.
ENDINGS = {"loops_reached": ("done", ""),
           "time_up": ("interrupted", "the time for this graph is up or the run was interrupted"),
           "budget_spent": ("exhausted", "the model-call budget is spent"),
           "agent_finished": ("exhausted", "the agent found nothing more worth trying"),
           "agent_idle": ("exhausted", f"the agent ended {MAX_IDLE_TURNS} turns in a row without changing its attempt")}


class LoopState(TypedDict):
    turn: int  # agent turns on this track so far (a resumed track continues its numbering)
    accepted: int  # loops accepted so far (the driver's loops_done)
    idle: int  # turns in a row that ended with the attempt unchanged
    last_text: str  # the source judged last (each turn's attempts start from the best accepted source)
    changed: bool  # the last turn left an attempt to judge
    note: str  # why nothing was judged after the last turn, when nothing was
    final: str  # the last turn's final answer
    verdict: dict | None  # the host verdict on the last turn's attempt (None: nothing judged since)
    feedback: str | None  # what the next turn's message starts with
    route: str  # decide's choice: why another turn follows, or how the track ends (ENDINGS)


@dataclass
class Host:
    """What the nodes use besides the state: the LangGraph context of one track's run."""

    agent: object  # the compiled Deep Agent
    state: object  # optimizer._TrackState: the track, the current attempt
    settings: object
    budget: ModelCallBudget
    provider: Provider
    submit: Callable[[Candidate], dict]  # the driver's judge-and-record; returns the verdict dict
    expired: Callable[[], bool] | None = None  # the run's and this graph's time limits (default: the track's)
    window: int | None = None  # the model's context window in tokens, when known

    def time_up(self) -> bool:
        return (self.expired or self.state.track.expired)()


def run_loop(host: Host, loops_done: int = 0) -> tuple[str, str]:
    """Run the track's turns; return the driver's (status, reason): done, interrupted or exhausted."""
    track = host.state.track
    start: LoopState = {"turn": len(list(track.profiles.glob("turn_*.json"))), "accepted": loops_done, "idle": 0,
                        "last_text": track.best_text, "changed": False, "note": "", "final": "", "verdict": None,
                        "feedback": None, "route": ""}
    out = loop_graph().invoke(start, {"recursion_limit": RECURSION_LIMIT}, context=host)
    status, reason = ENDINGS[out["route"]]
    if out["route"] == "agent_finished":
        reason = f"{reason}: {host.state.finished}"[:500]
    return status, reason


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
        limit = 6000 if not host.window else max(1000, min(6000, host.window * 4 // 20))
        idle, feedback, why = 0, _verdict_message(vd, limit), "accepted" if vd.get("accepted") else "rejected"
    elif s["route"]:  # a turn ran and left nothing to judge
        idle += 1
        feedback = (s.get("note") or "Your turn ended with no attempt file changed, so nothing was judged.") + (
            " If an idea in reach of its roofline is left, try it this turn; if nothing is worth trying, call "
            "`finish` with the reason.")
        why = "unchanged"
    else:
        why = "start"
    if accepted >= host.settings.loops:
        route = "loops_reached"
    elif host.state.finished:
        route = "agent_finished"
    elif host.time_up():
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
    """One agent turn on fresh attempt files (copies of the best accepted source), to its final answer;
    then the host picks the attempt the gate judges (`_choose`)."""
    from langchain_core.messages import HumanMessage

    from tilesmith.search.agent.ledger import turn_attempts
    from tilesmith.search.agent.trace import TurnTrace

    host = runtime.context
    state, track, budget = host.state, host.state.track, host.budget
    turn = s["turn"] + 1
    start_text = track.best_text
    state.turn = turn
    state.attempts = turn_attempts(track.dir, turn, start_text, len(state.attempts) or 1)
    state.attempt = state.attempts[0]
    msg = _turn_message(host, s["accepted"], s["feedback"])
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
    for p in state.attempts:  # an attempt the agent deleted: judge nothing from it
        if not p.exists():
            p.write_text(start_text)
    edited = any(p.read_text() != start_text for p in state.attempts)
    chosen, note = (None, "") if error is not None else _choose(host, start_text)
    if chosen is not None:
        state.attempt = chosen
    _save_trace(track, turn, s["accepted"] + 1, state, budget, used_before, trace, msg, final, error, edited,
                chosen.name if chosen else None)
    _log(host, "agent_turn", turn, attempt=state.attempt.name, changed=edited, judged=chosen.name if chosen else None,
         model_calls=budget.used - used_before, error=None if error is None else type(error).__name__)
    if error is not None:
        raise TilesmithError(_error_reason(error, host.provider), code="provider-error",
                             hint="check the provider and the model; confirmed wins of this run are kept") from None
    return {"turn": turn, "changed": chosen is not None, "final": final, "note": note}


def _choose(host: Host, start_text: str):
    """(the attempt the gate judges, or None; why none): of this turn's changed files whose last check
    did not fail, the fastest in one interleaved screen (no screen when there is only one)."""
    from tilesmith.search.agent.ledger import virtual
    from tilesmith.search.measure import screen

    state = host.state
    changed = [p for p in state.attempts if p.read_text() != start_text]
    if not changed:
        return None, ""
    ok = [p for p in changed if not state.ledger.check_failed(virtual(state.track.dir, p), p.read_text())]
    if not ok:
        names = ", ".join(virtual(state.track.dir, p) for p in changed)
        return None, f"Nothing was judged: every changed file ({names}) failed its last check."
    if len(ok) == 1:
        return ok[0], ""
    texts = [p.read_text() for p in ok]
    with state.timing_lock:
        res = screen(state.track.graph_dir, [("best", start_text)] +
                     [(virtual(state.track.dir, p), t) for p, t in zip(ok, texts)], budget_s=state.screen_budget_s)
    best_ms = res[0].median_ms
    for r in res[1:]:
        if r.median_ms is not None:
            state.ledger.update(r.label, screened_ms=r.median_ms, best_ms=best_ms)
    ranked = sorted(range(len(ok)), key=lambda i: (res[i + 1].median_ms is None, res[i + 1].median_ms or 0.0))
    _log(host, "choose", state.turn, screened={r.label: r.median_ms for r in res}, chosen=ok[ranked[0]].name)
    return ok[ranked[0]], ""


def gate(s: LoopState, runtime: Runtime[Host]) -> dict:
    """The host gate judges the attempt the host chose (through the driver, which records the verdict)."""
    from tilesmith.search.agent.ledger import virtual

    host = runtime.context
    track = host.state.track
    track.restore_best()  # the shell could have rewritten the timing baseline
    text = host.state.attempt.read_text()
    vd = host.submit(Candidate(text, f"agent turn {s['turn']}: {s['final'].strip()[:100]}", host.state.attempt))
    tm = (vd.get("confirmation") or vd.get("first") or {}).get("timing") or {}
    host.state.ledger.update(virtual(track.dir, host.state.attempt), verdict=(
        f"accepted {tm.get('speedup', 0):.3f}x" if vd.get("accepted") else
        f"rejected at {vd.get('stage')}: " + ", ".join(r.get("code", "") for r in vd.get("reasons", []))))
    _log(host, "gate", s["turn"], accepted=bool(vd.get("accepted")), stage=vd.get("stage"),
         attempt=host.state.attempt.name)
    return {"verdict": vd, "last_text": text}


# -- messages and traces ---------------------------------------------------------------------------
def _turn_message(host: Host, accepted: int, feedback: str | None) -> str:
    from tilesmith.search.agent.ledger import virtual

    state, settings, budget = host.state, host.settings, host.budget
    files = ", ".join(virtual(state.track.dir, p) for p in state.attempts)
    best = "/best.py (the best accepted source)" if (state.track.dir / "best.py").exists() else "the original wrapper"
    left = "unlimited" if budget.limit is None else f"{budget.remaining} of {budget.limit}"
    head = (f"Loop {accepted + 1} of {settings.loops}. Current attempt: /attempts/{state.attempt.name} (yours). "
            f"This turn's attempt files: {files}, each a copy of {best}: one idea per file. To be accepted the "
            f"judged attempt must beat {best} by at least {settings.min_improvement:.1%}. Model calls left: {left}.")
    ledger = f"\n\nLedger (what was tried; /profiles/ledger.json):\n{state.ledger.table()}"
    start = "" if feedback else " Read the skills that apply, profile, then call `ideas` with 3-5 ideas."
    warm = f"\n\n{state.warm_note}" if state.warm_note and not feedback else ""
    return (f"{feedback}\n\n" if feedback else "") + head + start + warm + ledger


def _verdict_message(vd: dict, limit: int = 6000) -> str:
    from tilesmith.gate.verdict import compact_verdict

    tm = (vd.get("confirmation") or vd.get("first") or {}).get("timing") or {}
    if vd.get("accepted"):
        return (f"The host gate ACCEPTED your candidate: speedup {tm.get('speedup', 0):.3f}x "
                f"(lower bound {tm.get('speedup_low', 0):.3f}x) over the previous best. It is now /best.py. "
                f"Find a further, different improvement on top of it, or call `finish` if none is worth trying.")
    reasons = "; ".join(f"{r.get('code')}: {r.get('message')}" for r in vd.get("reasons", []))
    return (f"The host gate REJECTED your candidate at stage '{vd.get('stage')}': {reasons}\n"
            f"Verdict: {json.dumps(compact_verdict(vd))[:limit]}\nThe next turn starts again from the best "
            f"accepted source; fix the idea in a new file or try another.")


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


def _save_trace(track, turn, loop, state, budget, used_before, trace, msg, final, error, changed, judged=None) -> None:
    write_json(track.profiles / f"turn_{turn:03d}.json", {
        "turn": turn, "loop": loop, "attempt": f"attempts/{state.attempt.name}", "attempt_changed": changed, "judged": judged,
        "message": msg, "final_answer": final, "error": None if error is None else f"{type(error).__name__}: {error}"[:2000],
        "budget": {"limit": budget.limit, "used": budget.used, "this_turn": budget.used - used_before,
                   "blocked": budget.blocked, "by_agent": dict(budget.by_agent)},
        **trace.summary(), "events": trace.events})
