"""The rows of a `report` (build.py builds them from a run's files, setting.py says which CUDA-graph setting
wins; the CLI and the HTML page render them): per kernel, per candidate, per graph, the program's estimate,
the settings that win, and the whole report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class KernelRow:
    name: str
    kind: str  # triton | template | cpp | extern | device
    calls: int  # launches per graph call
    time_ms: float  # per graph call
    share: float  # of the graph's summed kernel time
    bytes: int = 0  # per graph call, from its arguments (tilesmith/profile/baseline.py)
    flops: int = 0
    gbps: float | None = None  # achieved
    tflops: float | None = None
    bw_frac: float | None = None  # of the device's bandwidth ceiling
    flop_frac: float | None = None  # of its FLOP ceiling
    headroom_ms: float | None = None  # time above the roofline bound
    klass: str = ""  # latency | memory | compute | unknown
    site: str = ""  # the wrapper line that launches it ("L338: extern_kernels.addmm(...)"), first of several
    tried: str = ""  # what the tuner's screen made of this kernel's variants (build.tried_text); "" before a run


# The GB/s column's peak is the device memory's, measured with a copy far larger than the last-level cache
# (tilesmith/profile/roofline.py): a kernel whose data stays in cache (a few MB on a CPU core's L2/L3, up to 50 MB in an
# H200's L2) moves it faster than that, so its share reads above 100 %.
# That is no error, and such a kernel has no headroom by this roofline: the renderers say so in the cell.
BANDWIDTH_COLUMN = "GB/s (of DRAM peak)"
BANDWIDTH_NOTE = ("GB/s above 100 % of the DRAM peak: the kernel's data stays in cache, which is faster than the "
                  "device memory the peak was measured on (a copy far larger than the last-level cache)")


def rate_text(value: float | None, frac: float | None, bandwidth: bool = False) -> str:
    """An achieved rate and its share of the ceiling, as the report's tables show it: "7.52 (67 %)"; a bandwidth
    share above 100 % is marked "(242 %, in cache)" (BANDWIDTH_NOTE)."""
    if value is None:
        return "-"
    if frac is None:
        return f"{value:.3g}"
    cached = ", in cache" if bandwidth and frac > 1.0 else ""
    return f"{value:.3g} ({100 * frac:.0f} %{cached})"


@dataclass
class CandidateRow:
    """One gate verdict (profiles/verdict_NNN.json)."""

    key: str
    index: int  # NNN: the verdict's number within its graph's track
    label: str
    t_s: float | None  # seconds from the run's start to when the verdict was written (file time)
    wall_s: float | None  # what the gate spent judging it
    accepted: bool
    stage: str  # the stage reached
    reasons: list[str]  # reason codes when rejected
    # baseline/candidate from the deciding pass (confirmation, else first); measured against the
    # source that was best when it was judged, not necessarily the original. None: no timing ran.
    # The interval spans both passes (lowest low, highest high), as the driver credits it.
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    # the gate's first reason as a sentence (which input set, which output, error against the allowed
    # error), so a rejection reads without opening the verdict file
    why: str = ""
    sandbox: str = ""  # the isolation the candidate ran under: namespaces | env-only ("" in older verdicts)
    mode: str = ""  # the gate's timing mode: launch | graph (a CUDA-graph replay of the original); "" untimed


@dataclass
class GraphReport:
    key: str
    kind: str
    eligible: bool | None  # None: the workspace could not be read
    ineligible_reason: str
    seen: int | None  # how often the program compiled this graph (weights the program estimate)
    status: str  # the track's status; "not in run" for graphs the run did not optimize
    reason: str
    baseline_ms: float | None  # one call of Inductor's wrapper: baseline profile, else the gate's timing
    baseline_source: str | None  # profile | gate | None
    # launch: plain calls (the profile always is); graph: Inductor's code replayed from a CUDA graph, as the
    # gate times a graph compiled with CUDA graphs (their baseline is the gate's, since that is production)
    baseline_mode: str | None
    best_ms: float | None  # one call of the best accepted source (baseline_ms / speedup)
    speedup: float | None  # original / best accepted (> 1 is faster); None: nothing accepted
    speedup_low: float | None  # lower confidence bound of that speedup
    speedup_high: float | None
    loops_done: int
    candidates: int  # candidates judged by the gate
    rejected_by_stage: dict
    variants_screened: int  # tuner variants measured before the gate (profiles/tuner_variants.jsonl)
    model_calls: int | None  # None: no agent trace (profiles/turn_*.json) in this track
    cached: dict | None  # cache.json on an exact hit: the installed artifact that was reused
    kernel_ms: float | None  # summed kernel time of one call (baseline profile)
    launch_overhead_ms: float | None
    top_kernels: list[KernelRow] = field(default_factory=list)
    other_kernels_ms: float = 0.0
    notes: list[str] = field(default_factory=list)
    profile_class: str = ""  # launch | latency | memory | compute | unknown (baseline profile)
    gap_ms: float | None = None  # device idle between kernels per call (CUDA)
    headroom_ms: float | None = None  # summed kernel time above the roofline bounds
    ceilings: str = ""  # the device ceilings the fractions are against, and their source
    counters: str = ""  # whether hardware counters were read
    compile_mode: str = ""  # plain | cudagraphs (reduce-overhead, max-autotune); "" unknown (graph.json)
    device: str = ""
    setting: GraphSetting | None = None  # who replays it and by how much that wins (setting.py)


@dataclass
class ProgramEstimate:
    """The program's compiled-graph time, estimated from per-graph measurements: sum of
    baseline_ms * seen, and the same with each accepted graph's best_ms. Not an end-to-end
    measurement: time outside the compiled graphs and in unmeasured graphs is not included."""

    baseline_ms: float
    optimized_ms: float  # with the accepted (or cached) graphs' best times
    optimized_high_ms: float  # with each accepted graph at its speedup_low (the pessimistic end)
    speedup: float
    speedup_low: float
    graphs_measured: int
    graphs_total: int
    graphs_improved: int
    note: str


@dataclass
class GraphSetting:
    """Who replays one graph once the run's winners are installed, and by how much that wins."""

    # tilesmith-replay | inductor-replay-of-tilesmith-code | inductor-replay | tilesmith-replay-over-launches |
    # tilesmith-code | inductor-code | unknown
    winner: str
    statement: str  # one line for the reader
    speedup: float | None = None  # the report's speedup of the graph (accepted chain), copied, not recomputed
    speedup_low: float | None = None
    timed_in: str = ""  # the gate's timing mode of the accepted chain: graph | launch | mixed | "" (none)


@dataclass
class ProgramSetting:
    """The program's line: how many graphs use CUDA graphs, who replays them, and the change to make."""

    graphs_total: int
    graphs_cudagraphs: int  # compiled with CUDA graphs
    tilesmith_replay_wins: int  # of those: tilesmith's replay beat Inductor's
    inductor_replay_of_tilesmith_code: int  # of those: Inductor's replay kept, of accepted code
    inductor_replay_kept: int  # of those: nothing accepted (or not optimized)
    replay_over_launches: int  # graphs compiled without CUDA graphs whose launches tilesmith's replay took over
    estimate: ProgramEstimate | None  # over the CUDA-graph graphs whose baseline is Inductor's replay (gate)
    statement: str
    change: str  # what to change in the program, exactly
    note: str = ""  # what "reduce-overhead's replay" was, as the gate timed it


@dataclass
class Report:
    run_id: str
    status: str
    optimizer: str | None
    created: str | None
    ended: str | None
    workspace: str | None
    environment: dict
    settings: dict
    graphs: list[GraphReport]
    program: ProgramEstimate | None
    candidates: list[CandidateRow]  # every verdict of the run, in the order they were written
    notes: list[str] = field(default_factory=list)
    setting: ProgramSetting | None = None  # which CUDA-graph setting wins, for the program (setting.py)

    def to_dict(self) -> dict:
        return asdict(self)
