"""Input sets for the gate, made in the deciding process from graph.json ranges and data.pt.

Every set has exactly the captured layout (size, stride, storage offset 0, dtype); values are drawn for
the whole storage span, so expanded and overlapping views stay valid. Integer and bool inputs stay
inside their recorded [min, max] (indices stay in bounds); floats follow several distributions; graph
parameters are perturbed around their captured values, so work that is only right for the captured
weights (a LayerNorm whose weight happens to be all ones) is caught.
"""

from __future__ import annotations

import hashlib
import math
import threading

import torch

from tilesmith.capture.tensors import span_numel


def parameter_indices(meta: dict) -> set[int]:
    """Positions of the inputs graph.json marks as parameters (weights, buffers of the module): timed in
    one buffer at one address, as a program's weights stay between steps."""
    return {i for i, d in enumerate(meta.get("inputs") or []) if d.get("parameter")}


def updated_indices(meta: dict) -> set[int]:
    """Positions of the inputs the graph updates in place (graph.json's mutated_inputs): running statistics, an
    optimizer's parameters, moments and step, a KV cache."""
    return {int(i) for i in meta.get("mutated_inputs") or []}


def rescaled_parameters(meta: dict) -> set[int]:
    """The parameters (one buffer for every set) whose floats the gate scales afresh before each timed sample, as it
    does every other input's: those the graph updates in place (their integers, a position or a step count, kept),
    and all of them where no other input can vary (each an integer or bool with one recorded value, or a float
    that is all zeros: scaling keeps zeros). Otherwise every sample replays the same values: a decode step's
    (token, position, cache refilled unchanged) and a one-token lookup's (token id 47 each call) were accepted
    answering from memory by a probe of their inputs (tests/redteam_updates.remembers_the_step_by_its_state;
    tests/redteam.remembers_outputs_by_address_and_first_value measured 5.8x)."""
    params = parameter_indices(meta)
    still = all(_still(d) for j, d in enumerate(meta.get("inputs") or []) if j not in params)
    return set(params) if still else params & updated_indices(meta)


def _still(info: dict) -> bool:
    """Whether the gate's draws leave this (non-parameter) input as captured in every sample."""
    if info.get("kind", "tensor") != "tensor":
        return True
    r = info.get("range") or {}
    if "min" not in r or "max" not in r:
        return False
    floating = str(info.get("dtype", "")).startswith(("float", "bfloat", "complex"))
    return r["min"] == r["max"] and (not floating or r["min"] == 0)


def state_horizon(meta: dict) -> int | None:
    """For a graph that updates a parameter in place (one buffer for every set, carrying state from call to call:
    a KV cache's position counter, an optimizer's step), the most calls the gate makes from the captured state
    before restoring it: as many as the program itself made (graph.json program_gap's calls, at least 1), so every
    state a call starts from is one the program's own calls reached. Beyond them a counter runs where the program
    never took it: a decode step's cache position past the cache's end (on the H100, the gate's 128 warm-up calls
    of 64 buffer sets indexed a 64-token cache out of bounds; "device-side assert triggered", an honest original
    rejected as `raised`). None: no such input (no limit)."""
    if not (updated_indices(meta) & parameter_indices(meta)):
        return None
    gap = meta.get("program_gap") if isinstance(meta.get("program_gap"), dict) else {}
    try:
        return max(1, int(gap.get("calls") or 1))
    except (TypeError, ValueError):
        return 1


def trees_static(meta: dict) -> list[int] | None:
    """The inputs the gate's trees mode marks static (gate/worker_trees.py): those Inductor marked static
    when it compiled the graph (graph.json's inductor_static_inputs), where each of them is one the gate
    keeps at one address across its buffer sets (parameter_indices) and no input is an earlier graph's
    output (graph.json's inputs_from_graphs, empty); None where the capture did not record them, Inductor
    marked others static too (a backward's saved activations) or an input comes from another graph: the
    trees then take their cheapest path, every input static."""
    marked = meta.get("inductor_static_inputs")
    if not isinstance(marked, list) or meta.get("inputs_from_graphs") != []:
        # An input that is an earlier graph's output is one the program's trees read in place (their own
        # managed memory) and the gate's buffer sets would move: copying it would charge the original for a
        # copy the program never makes. Unknown (None, or an older capture) counts as such an input.
        return None
    marked = sorted({int(i) for i in marked})
    return marked if set(marked) <= parameter_indices(meta) else None


RANDOM_KINDS = ("normal", "uniform", "positive", "heavy")
# Scale of the high-magnitude set, by dtype: large, yet far from overflow in a product of two inputs.
_LARGE = {torch.float16: 16.0, torch.bfloat16: 256.0, torch.float32: 1000.0, torch.float64: 1000.0}


def derive_seed(seed: int, *parts) -> int:
    """A 63-bit seed from a base seed and labels (hashlib, not hash(): stable across processes)."""
    h = hashlib.sha256(":".join(str(p) for p in (seed, *parts)).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def make_sets(meta: dict, captured: list, seed: int, random_sets: int = 4) -> list[tuple[str, list]]:
    """[(name, inputs)]: captured, `random_sets` random sets cycling RANDOM_KINDS, zeros, large, and, for a
    graph with weights and other inputs, "captured-weights": the weights exactly as captured with the other
    inputs drawn anew. That is what a program's later calls look like, and the one combination no other
    set has (the random sets move the weights, the captured set keeps everything, 'large' scales the rest
    out of range): code that recognised the captured weights and misbehaved only then would pass them all.
    CPU tensors."""
    infos = _infos(meta, captured)
    edge = derive_seed(seed, "edge")
    sets = [("captured", [_cpu_copy(x) for x in captured]), *draw_sets(meta, captured, seed, random_sets),
            ("zeros", _filled(captured, infos, "zeros", edge)), ("large", _filled(captured, infos, "large", edge))]
    weights = parameter_indices(meta)
    if weights and any(isinstance(x, torch.Tensor) and j not in weights for j, x in enumerate(captured)):
        keep = {j: _cpu_copy(captured[j]) for j in weights}  # copies of their own: a call may change its inputs
        sets.append(("captured-weights", _filled(captured, infos, "normal", derive_seed(seed, "captured-weights"),
                                                 keep)))
    return sets


def draw_sets(meta: dict, captured: list, seed: int, n: int, shared: frozenset | set = frozenset()) -> list:
    """[(name, inputs)]: n random sets cycling RANDOM_KINDS (make_sets' random part). The inputs at `shared`
    are drawn once, in the first set, and the same tensors stand in every other set (weights that keep one
    value through the timed calls): nothing is drawn only to be thrown away."""
    infos = _infos(meta, captured)
    sets: list = []
    for i in range(n):
        kind = RANDOM_KINDS[i % len(RANDOM_KINDS)]
        keep = {j: sets[0][1][j] for j in shared} if sets else None
        sets.append((f"{kind}-{i}", _filled(captured, infos, kind, derive_seed(seed, kind, i), keep)))
    return sets


def _infos(meta: dict, captured: list) -> list:
    return meta.get("inputs") or [{} for _ in captured]


_POOL: dict = {}
_POOL_LOCK = threading.Lock()
_BIG = 1 << 16  # elements: a tensor this large is drawn on a pool thread (torch's CPU kernels drop the GIL)


def thread_pool():
    """This process's threads for the deciding process's tensor work (drawing sets, comparing outputs):
    torch's CPU kernels drop the GIL, so big tensors are worked on side by side. One per process id: a
    forked child (a program's data loader) has none of its parent's threads."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    with _POOL_LOCK:  # several tracks decide at once with --jobs
        pool = _POOL.get(os.getpid())
        if pool is None:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
            pool = _POOL[os.getpid()] = ThreadPoolExecutor(max_workers=max(2, min(8, cores)),
                                                           thread_name_prefix="tilesmith-gate")
        return pool


def _filled(captured: list, infos: list, kind: str, set_seed: int, keep: dict | None = None) -> list:
    """One set: every input drawn by `_fill` from its own generator (seeded by the set's seed and its
    position, so the values do not depend on which thread drew them), big ones side by side on threads;
    the positions in `keep` take the given tensor instead."""
    def one(j: int):
        if keep is not None and j in keep:
            return keep[j]
        return _fill(captured[j], infos[j], kind, torch.Generator().manual_seed(derive_seed(set_seed, j)))

    big = [j for j, x in enumerate(captured) if isinstance(x, torch.Tensor) and x.numel() >= _BIG
           and not (keep is not None and j in keep)]
    if len(big) < 2:
        return [one(j) for j in range(len(captured))]
    pool = thread_pool()
    futures = {j: pool.submit(one, j) for j in big}
    return [futures[j].result() if j in futures else one(j) for j in range(len(captured))]


def _cpu_copy(x):
    if not isinstance(x, torch.Tensor):
        return x
    x = x.detach()
    n = span_numel(x)
    flat = x.as_strided((n,), (1,), x.storage_offset()).to("cpu", copy=True) if n else torch.empty(0, dtype=x.dtype)
    return flat.as_strided(x.size(), x.stride(), 0)


def _fill(x, info: dict, kind: str, g: torch.Generator):
    """A tensor with x's layout whose storage span holds fresh values of `kind`."""
    if not isinstance(x, torch.Tensor):
        return x
    base = _cpu_copy(x)
    n = span_numel(base)
    if n == 0:
        return base
    flat = base.as_strided((n,), (1,), 0)
    if base.dtype == torch.bool or not (base.dtype.is_floating_point or base.dtype.is_complex):
        vals = _integers(flat, info, kind, g)
    elif base.dtype.is_complex:
        vals = flat if kind != "zeros" else torch.zeros_like(flat)
    else:
        vals = _floats(flat, info, kind, g)
    flat.copy_(vals.to(flat.dtype))
    return base


def _integers(flat: torch.Tensor, info: dict, kind: str, g) -> torch.Tensor:
    r = info.get("range") or {}
    lo = int(r.get("min", flat.min().item() if flat.numel() else 0))
    hi = int(r.get("max", flat.max().item() if flat.numel() else 0))
    if kind == "zeros" or lo == hi:
        return torch.full(flat.shape, min(max(0, lo), hi), dtype=torch.int64)
    return torch.randint(lo, hi + 1, flat.shape, generator=g, dtype=torch.int64)


# Above this magnitude the draws are made in float64: mean + spread * z (or hi - lo) can overflow float32
# where the value itself fits (an attention mask filled with finfo(float32).min has a std near 1.7e38).
_F32_SAFE = 1e30


def _floats(flat: torch.Tensor, info: dict, kind: str, g) -> torch.Tensor:
    # Drawn in float32 for every float type up to float32 (the values are cast to the input's dtype after),
    # in float64 for float64 inputs and for magnitudes float32 arithmetic could overflow: half the bytes
    # and twice the speed on the big sets of a training graph, the same distribution at the input's precision.
    shape = flat.shape
    if kind == "zeros":
        return torch.zeros(shape, dtype=torch.float32 if flat.dtype != torch.float64 else torch.float64)
    r = info.get("range") or {}
    if "min" in r and "max" in r:
        lo, hi = r["min"], r["max"]
    else:  # no recorded range: the captured values' own (finite ones)
        finite = flat[torch.isfinite(flat)]
        lo = r.get("min", float(finite.min()) if finite.numel() else -1.0)
        hi = r.get("max", float(finite.max()) if finite.numel() else 1.0)
    mean = r.get("mean") or 0.0
    std = r.get("std") or 0.0
    if not all(map(math.isfinite, (lo, hi, mean, std))):
        lo, hi, mean, std = -1.0, 1.0, 0.0, 1.0
    big = max(abs(lo), abs(hi), abs(mean), abs(std)) > _F32_SAFE
    cdt = torch.float64 if flat.dtype == torch.float64 or big else torch.float32
    cap = flat.to(cdt)
    if kind == "large":
        return cap * _LARGE.get(flat.dtype, 100.0) if not info.get("parameter") else cap
    z = _draw(kind, shape, g, cdt)
    if info.get("parameter"):
        # A weight in another run of the same graph: the captured value moved by about its own spread.
        sigma = max(std, 0.1 * max(abs(lo), abs(hi)), 1e-2)
        v = cap + 0.5 * sigma * z
        return v.abs() if kind == "positive" else v
    spread = std if std > 0 else max(abs(lo), abs(hi), 1.0)
    if kind == "uniform" and hi > lo:
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=cdt)
    return mean + spread * z if kind != "positive" else abs(mean) + spread * z


def _draw(kind: str, shape, g, dtype=torch.float64) -> torch.Tensor:
    """Standardised draws: normal, uniform(-sqrt3, sqrt3), |normal|, or Student-t with 2 dof (heavy tails)."""
    if kind == "uniform":
        return (torch.rand(shape, generator=g, dtype=dtype) * 2 - 1) * math.sqrt(3)
    n = torch.randn(shape, generator=g, dtype=dtype)
    if kind == "positive":
        return n.abs()
    if kind == "heavy":
        u = torch.rand(shape, generator=g, dtype=dtype).clamp_min(torch.finfo(dtype).tiny)
        return (n / torch.sqrt(-u.log())).clamp(-100.0, 100.0)  # chi2(2) / 2 = -log(u)
    return n


# -- special values: inputs beyond the recorded range (issue 35) ------------------------------------------------

SPECIAL_KINDS = ("nonfinite", "extremes")
SPECIAL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Shares of an activation's elements that get special values. Low enough that most rows of a row-wise
# reduction (LayerNorm, softmax, a matmul's output row) stay free of NaN and outputs keep finite parts to
# compare; high enough that a 64x128 activation gets ~32 non-finite and ~256 extreme elements.
NONFINITE_SHARE = 1 / 256  # NaN, +inf, -inf in equal parts (at least one of each)
EXTREME_SHARE = 1 / 32  # half log-uniform magnitudes up to 2**59 (_EXTREME_LOG2), a quarter subnormals, -0.0


def special_targets(meta: dict, captured: list) -> list[int]:
    """The inputs the special-value sets change: float activations. Not parameters or buffers (a NaN weight
    poisons every output and a program never runs with one: that would test nothing the activations do
    not), not integer or bool inputs (indices must stay in bounds), not one-element tensors or inputs whose
    recorded range is a single value (a scale, an eps, an all-zero mask: configuration, not data; NaN there
    turns every output into NaN)."""
    infos = _infos(meta, captured)
    weights = parameter_indices(meta)
    out = []
    for j, x in enumerate(captured):
        if not isinstance(x, torch.Tensor) or x.dtype not in SPECIAL_DTYPES or j in weights or x.numel() < 2:
            continue
        r = (infos[j] if j < len(infos) else {}).get("range") or {}
        if "min" in r and "max" in r and r["min"] == r["max"]:
            continue
        out.append(j)
    return out


def special_sets(meta: dict, captured: list, seed: int) -> list[tuple[str, list]]:
    """[(name, inputs)] for SPECIAL_KINDS, or [] where no input is a float activation. Each set: the
    parameters exactly as captured (what a program runs), integer and bool inputs drawn in their recorded
    [min, max] and floats drawn as in the 'normal' random set, then in the special_targets inputs a share
    of the elements replaced: "nonfinite" NaN, +inf, -inf; "extremes" finite values beyond any recorded
    range (magnitudes log-uniform over the dtype's exponents up to 2**59, subnormals, -0.0). Two sets, so that NaN
    does not hide what the extreme magnitudes do. CPU tensors."""
    targets = special_targets(meta, captured)
    if not targets:
        return []
    infos = _infos(meta, captured)
    keep = {j: _cpu_copy(captured[j]) for j in parameter_indices(meta)}  # one copy, shared: workers copy each set
    sets = []
    for kind in SPECIAL_KINDS:
        s = derive_seed(seed, "special", kind)
        inputs = _filled(captured, infos, "normal", s, keep)
        for j in targets:
            _inject(inputs[j], kind, torch.Generator().manual_seed(derive_seed(s, "inject", j)))
        sets.append((kind, inputs))
    return sets


def _inject(x: torch.Tensor, kind: str, g: torch.Generator) -> None:
    """Replace a share of x's storage span (offset 0, as _fill makes it) with special values, in place. A position
    drawn twice gets the later value, whatever the process's thread count (the sets are built on the CPU, for every
    device). Left to torch's parallel indexing, an assignment through repeated positions writes either value on more
    than one thread: the same seed then made other sets in another decision, and the original's outputs, kept from an
    earlier decision on that graph and seed, were compared with a candidate's run on other inputs (an honest candidate
    rejected as `wrong-values` and `input-mutated` on the extremes set, with two test suites side by side)."""
    n = span_numel(x)
    flat = x.as_strided((n,), (1,), 0)
    share = NONFINITE_SHARE if kind == "nonfinite" else EXTREME_SHARE
    k = min(n, max(4, round(n * share)))
    pos = torch.randint(0, n, (k,), generator=g)  # at 1/32 of n, a few hundred positions come twice
    vals = (_nonfinite(k) if kind == "nonfinite" else _extremes(k, x.dtype, g)).to(x.dtype)
    # each position once, with the value of its last draw (scatter's max of the draws' order)
    pos, where = torch.unique(pos, return_inverse=True)
    last = torch.zeros(pos.numel(), dtype=torch.long).scatter_reduce_(0, where, torch.arange(k), "amax",
                                                                      include_self=False)
    vals = vals[last]
    flat[pos] = vals


def _nonfinite(k: int) -> torch.Tensor:
    return torch.tensor([math.nan, math.inf, -math.inf], dtype=torch.float64).repeat(k // 3 + 1)[:k]


# Log2 of the largest extreme magnitude, by dtype: the square root of what the arithmetic holds (float32 for the
# half types and float32, as Inductor computes and accumulates them), less 2**5. Above it, a product of two
# extremes (two activations: attention, a backward's weight gradient) lands near overflow, and whether a dot
# product overflows depends on the order of its sum: an fp32-accumulated bf16 matmul summed in another order
# placed inf and NaN unlike the original's on every one of 10 seeds with the full range (3.4e38). Up to 2**59
# (5.8e17) products stay 2**10 below it. Infinities themselves are the other set's.
_EXTREME_LOG2 = {torch.float16: math.log2(65504.0), torch.bfloat16: 59.0, torch.float32: 59.0, torch.float64: 507.0}


def _extremes(k: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """k values in float64: 2 in 4 of magnitude 2**e, e uniform from the dtype's smallest normal exponent to
    _EXTREME_LOG2 (float16: its largest finite value); 1 in 4 subnormal (2**e between its smallest subnormal
    and smallest normal); 1 in 4 -0.0 (each at least once); signs random. Clamped to the dtype's largest
    finite value, so that casting cannot round up to inf."""
    f = torch.finfo(dtype)
    lo_normal, hi = math.log2(f.tiny), min(math.log2(f.max), _EXTREME_LOG2.get(dtype, math.log2(f.max)))
    lo_sub = math.log2(f.tiny * f.eps)  # the smallest subnormal: 2**-149 for float32, 2**-24 for float16
    u = torch.rand(k, generator=g, dtype=torch.float64)
    which = torch.randint(0, 4, (k,), generator=g)
    which[:4] = torch.arange(min(k, 4))  # every kind at least once, even in a 64-element tensor
    e = torch.where(which == 2, lo_sub + (lo_normal - lo_sub) * u, lo_normal + (hi - lo_normal) * u)
    sign = torch.randint(0, 2, (k,), generator=g).to(torch.float64).mul_(2).sub_(1)
    v = (torch.exp2(e) * sign).clamp_(-f.max, f.max)
    return torch.where(which == 3, torch.tensor(-0.0, dtype=torch.float64), v)
