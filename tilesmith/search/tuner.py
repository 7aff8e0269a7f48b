"""The built-in tuner: no model, no API key.

First, for a CUDA graph that runs as plain launches and spends much of its time outside kernels
(the baseline profile's launch overhead), the whole call replayed from a CUDA graph
(`tilesmith.cudagraph`): screened against the current source, and handed to the gate when it screens
faster. Next, the graph lowered again by Inductor under config variants (tilesmith/search/relower.py).
Then, for each kernel, in order of its share of the graph's time, the launch parameters its
generated source allows (Triton block sizes, warps, stages; C++ OpenMP thread counts, the serial
path), screened cheaply on the whole call; the best per kernel are assembled and the assembled
wrapper goes to the gate. Each loop starts from the best confirmed source and tunes the kernels not
changed yet."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator

from tilesmith.search import Candidate, Track, from_generator
from tilesmith.search import kernels as K
from tilesmith.search.graphed import GRAPHED_IMPORT, GRAPHED_LABEL, GRAPHED_OVER_INDUCTOR_LABEL, graphed_text
from tilesmith.search.measure import screen


@dataclass
class TunerConfig:
    max_kernels: int = 6  # kernels screened per loop, biggest share first
    screen_budget_s: float = 3.0  # timing seconds per kernel screen (all its variants together)
    min_gain: float = 0.01  # a variant must screen this much faster than the current code to be kept
    # The CUDA-graph variant is tried when launch overhead is at least this share of a call (profile),
    # or when there is no profile.
    graph_min_overhead_share: float = 0.2
    # At this share or more the replay is proposed to the gate without a screen first: removing most of the
    # launch overhead of such a call is all but certain to win, and the screen (a worker of its own that
    # loads the wrapper: the profile worker's load of a model's graph took 12-16 s on the H200) only delays
    # the gate's decision.
    graph_unscreened_share: float = 0.5


def search(track: Track, config: TunerConfig | None = None) -> Generator[Candidate, dict, None]:
    """Yield candidates; receive each one's verdict (dict) through send().

    Of `track` it uses: graph and graph_dir, best_text (current best source), profile (baseline Profile or
    None), record(variant) to log every variant, and expired() for the time limit.
    """
    cfg = config or TunerConfig()
    replay = yield from _graphed_step(track, cfg)
    # Whole-graph re-lowering under Inductor config variants (tilesmith/search/relower.py).
    from tilesmith.search import relower

    yield from _relowered_then_replayed(
        relower.search(track, Candidate, screen_budget_s=cfg.screen_budget_s, min_gain=cfg.min_gain,
                       replayed=replay_near_even(track, replay)), track, cfg)
    done: set[str] = set()
    while True:
        base_text = track.best_text
        header, base = _split(base_text)
        order = _ordered(K.find_kernels(base), track.profile)
        todo = [k for k in order if k.name not in done and K.variants(k)][: cfg.max_kernels]
        if not todo:
            return
        choices = []  # (gain, kernel, label, code)
        for k in todo:
            if track.expired():
                return
            done.add(k.name)
            choice = _screen_kernel(track, cfg, k, header, base)
            if choice:
                choices.append(choice)
        if not choices:
            continue  # nothing on these kernels; the next round tries the rest (or ends)
        choices.sort(key=lambda c: c[0], reverse=True)
        yield from _assembled(header, base, choices)


def _graphed_step(track: Track, cfg: TunerConfig) -> Generator[Candidate, dict, "dict | None"]:
    """The whole call replayed from a CUDA graph: screened against the current source and yielded when
    faster, or yielded straight away where a screen would say nothing the gate needs (_screen_graphed)."""
    if _graphable(track, cfg) and not track.expired():
        text = graphed_text(track.best_text)
        if not _screen_graphed(track, cfg):
            return (yield Candidate(text, _graphed_label(track)))
        results = screen(track.graph_dir, [("current", track.best_text), (GRAPHED_LABEL, text)],
                         budget_s=cfg.screen_budget_s)
        current, r = results[0].median_ms, results[1]
        track.record({"kernel": "(whole call)", "variant": GRAPHED_LABEL, "median_ms": r.median_ms,
                      "current_ms": current, "samples": len(r.samples_ms), "error": r.error})
        if current and r.median_ms and current / r.median_ms - 1 > cfg.min_gain:
            return (yield Candidate(text, _graphed_label(track)))
    return None


def _relowered_then_replayed(inner: Generator[Candidate, dict, None], track: Track, cfg: TunerConfig):
    """The re-lowering search's candidates, and after one is accepted as plain code on a graph Inductor
    replays, the whole-call replay of the new code before the search goes on: less GPU work leaves the
    trees' host time per call (their Python) the larger part of the step, which our replay does not pay
    (the MoE on the H200, benchmarks/RESULTS-history.md: topk as a sort took the GPU time per step from 0.114 to 0.093 ms,
    accepted at 1.16x, and under the trees the program's step was then host-bound)."""
    verdict = None
    tried = False
    try:
        while True:
            try:
                cand = inner.send(verdict) if verdict is not None else next(inner)
            except StopIteration:
                return
            verdict = yield cand
            if verdict and verdict.get("accepted") and not tried and GRAPHED_IMPORT not in track.best_text \
                    and _inductor_replays(track):
                tried = True
                yield from _graphed_step(track, cfg)
    finally:
        inner.close()


def _inductor_replays(track: Track) -> bool:
    """Whether Inductor compiled the track's graph with CUDA graphs (reduce-overhead, max-autotune)."""
    return track.graph.compile_mode == "cudagraphs"


def replay_near_even(track: Track, verdict: dict | None) -> bool:
    """Whether the gate found our replay of a graph Inductor replays (reduce-overhead, max-autotune) not
    slower than Inductor's trees but short of the threshold: a GPU-bound graph, where our replay's smaller
    host cost is a gain too small alone. Re-lowered candidates then go to the gate replayed as well, so that
    a kernel-level gain and the replay's add up instead of each facing the threshold on its own."""
    if not verdict or verdict.get("accepted") or verdict.get("stage") not in ("timing", "confirmation"):
        return False
    codes = [r.get("code") for r in verdict.get("reasons") or []]
    if not codes or any(c != "not-faster" for c in codes):  # wrong values, a forged timing...: not this
        return False
    timing = (verdict.get("first") or {}).get("timing") or {}
    return _inductor_replays(track) and float(timing.get("speedup") or 0.0) >= 1.0


def _screen_kernel(track: Track, cfg: TunerConfig, k, header: str, base: str):
    """Screen every launch-parameter variant of kernel `k` on the whole call against the current source
    (`header + base`), log each; (gain, k, label, code) of the fastest if it gains more than min_gain."""
    vs = K.variants(k)
    results = screen(track.graph_dir, [("current", header + base)] +
                     [(label, header + K.replace_kernel(base, k, code)) for label, code in vs],
                     budget_s=cfg.screen_budget_s)
    current = results[0].median_ms
    for (label, _), r in zip(vs, results[1:]):
        track.record({"kernel": k.name, "variant": label, "median_ms": r.median_ms,
                      "current_ms": current, "samples": len(r.samples_ms), "error": r.error})
    ok = [(r.median_ms, label, code) for (label, code), r in zip(vs, results[1:]) if r.median_ms]
    if current and ok:
        best_ms, label, code = min(ok)
        gain = current / best_ms - 1
        if gain > cfg.min_gain:
            return gain, k, label, code
    return None


def _assembled(header: str, base: str, choices: list) -> Generator[Candidate, dict, None]:
    """The best variant of every kernel assembled into one candidate first; if the gate rejects it, each
    single change on its own, until one is accepted."""
    tries = [choices] + ([[c] for c in choices] if len(choices) > 1 else [])
    for combo in tries:
        text = base
        for _, k, _, code in combo:
            kk = next(x for x in K.find_kernels(text) if x.name == k.name)
            text = K.replace_kernel(text, kk, code)
        label = "; ".join(f"{k.name}: {lab}" for _, k, lab, _ in combo)
        verdict = yield Candidate(header + text, label)
        if verdict and verdict.get("accepted"):
            return


run_track = from_generator(lambda track, settings: search(track))  # the tuner as an Optimizer


def _split(text: str) -> tuple[str, str]:
    """(the FX header exactly as written, the wrapper source)."""
    from tilesmith.source import split_header

    src = split_header(text)[1]
    return text[: len(text) - len(src)], src


def _ordered(kernels: list, profile) -> list:
    """Kernels by their roofline headroom in the baseline profile (time a kernel at the device's
    ceilings would save), else their time, biggest first; unprofiled ones last."""
    share = {k.name: (k.headroom_ms if getattr(k, "headroom_ms", None) is not None else k.time_ms)
             for k in (profile.kernels if profile else [])}
    return sorted(kernels, key=lambda k: -share.get(k.name, -1.0))


def _graphed_label(track) -> str:
    return GRAPHED_OVER_INDUCTOR_LABEL if _inductor_replays(track) else GRAPHED_LABEL


def _screen_graphed(track, cfg: TunerConfig) -> bool:
    """Whether the whole-call replay is screened before the gate. Not for a graph Inductor replays
    (reduce-overhead): the screen times plain launches, the gate Inductor's own replay, so the screen says
    nothing the gate needs. Not where the baseline profile puts launch overhead at graph_unscreened_share of
    the call or more. Screened otherwise (no profile, or overhead between the two shares)."""
    if _inductor_replays(track):
        return False
    p = track.profile
    return p is None or p.launch_overhead_share < cfg.graph_unscreened_share


def _graphable(track, cfg: TunerConfig) -> bool:
    """A launch-bound CUDA graph not replayed by us yet. A graph Inductor replays (reduce-overhead,
    max-autotune) counts too: the gate times our replay of the same code against Inductor's."""
    if not track.graph.device.startswith("cuda"):
        return False
    if GRAPHED_IMPORT in track.best_text:
        return False
    p = track.profile
    return p is None or p.launch_overhead_share >= cfg.graph_min_overhead_share
