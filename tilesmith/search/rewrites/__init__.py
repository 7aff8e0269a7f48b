"""Graph rewrites the tuner tries before Inductor lowers a captured graph again (issue 37): the moves a kernel
engineer makes first, where no Inductor config does them.

Each rewrite is its own module with `precondition(gm) -> str` (why it does not apply, "" when it does) and
`apply(gm) -> int` (sites changed), both on the aten graph the re-lowering worker traces from the stored repro
(tilesmith/search/relower_worker.py). A rewrite goes to the re-lowering search as one `Variant` whose `trace` is
its name: it is compiled, checked to keep the graph's ABI, screened on the whole call, and judged by the gate like
any other variant (the gate's tolerance decides where it changes rounding). With a baseline profile, the rewrites
are tried in order of the time the profile puts in the kernels they address, and one whose kernels take no time
there is not tried (recorded, with why).

Off by default: TILESMITH_REWRITES turns them on (docs/settings.md). They were tested on CPU only; the project
lands GPU-path changes only verified on a GPU or behind a setting that is off. Unset, the tuner does exactly what
it did without them. Standard library only here: the modules that use torch are imported in the worker.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

from tilesmith.errors import TilesmithError


@dataclass(frozen=True)
class Rewrite:
    name: str  # what TILESMITH_REWRITES and Variant.trace call it
    label: str  # how the tuner's records (and so the report) name it
    ops: tuple[str, ...]  # aten ops as the repro spells them: a graph calling none of them has nothing to rewrite
    kernels: str  # regex on the profile's kernel names (wrapper globals, library calls) whose time it addresses
    module: str  # the module holding precondition(gm) and apply(gm) (imports torch: the worker only)


REWRITES = {r.name: r for r in (
    Rewrite("merge-linears", "parallel linears as one GEMM", ("aten.mm.", "aten.addmm."),
            r"(^|[._])(add)?mm(_|$)", "tilesmith.search.rewrites.merge_linears"),
    Rewrite("patchify-conv", "patch convolution as a GEMM", ("aten.convolution.",),
            r"conv", "tilesmith.search.rewrites.patchify_conv"),
)}

_OFF = ("", "0", "off", "false", "no")
_ALL = ("1", "on", "true", "yes", "all")


def chosen(value: str) -> list[Rewrite]:
    """The rewrites TILESMITH_REWRITES turns on: none when unset, empty, 0 or off; all for 1, on or all; else
    the comma-separated names. An unknown name is a usage error."""
    v = (value or "").strip().lower()
    if v in _OFF:
        return []
    if v in _ALL:
        return list(REWRITES.values())
    names = [n.strip() for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in REWRITES]
    if unknown:
        raise TilesmithError(f"TILESMITH_REWRITES names no rewrite {', '.join(unknown)}", code="usage",
                             hint=f"unset it, or set it to 1 (all) or some of {', '.join(REWRITES)}")
    return [REWRITES[n] for n in dict.fromkeys(names)]


def ordered(rewrites: list[Rewrite], profile,
            min_share: float = 0.0) -> tuple[list[Rewrite], list[tuple[Rewrite, str]]]:
    """(the rewrites to try, biggest first, and those not tried with why) by the baseline profile: each by the
    roofline headroom (else the time) of the kernels it addresses. Not tried: one whose kernels take no time, or
    no more than `min_share` of the call's wall time (removing them all would not gain what a variant must).
    Without a profile: all, in the given order."""
    if profile is None or not getattr(profile, "kernels", None):
        return list(rewrites), []
    weight, skipped = {}, []
    for r in rewrites:
        ks = [k for k in profile.kernels if re.search(r.kernels, k.name)]
        ms = sum(k.time_ms for k in ks)
        share = ms / profile.wall_ms if profile.wall_ms else 1.0
        if not ks or ms <= 0:
            skipped.append((r, f"the baseline profile shows no time in the kernels it addresses (/{r.kernels}/)"))
        elif share <= min_share:
            skipped.append((r, f"its kernels (/{r.kernels}/) take {share:.1%} of the call: removing them all would "
                               f"not gain the {min_share:.0%} a variant must"))
        else:
            weight[r.name] = sum(k.headroom_ms if k.headroom_ms is not None else k.time_ms for k in ks)
    kept = sorted((r for r in rewrites if r.name in weight), key=lambda r: -weight[r.name])
    return kept, skipped


def named(trace: str) -> list[Rewrite]:
    """The graph rewrites a variant's trace names: one name, or several joined by "+" (applied in that order);
    [] when it names anything else (a decomposition of relower_worker.TRACES) or nothing."""
    names = trace.split("+") if trace else []
    return [REWRITES[n] for n in names] if names and all(n in REWRITES for n in names) else []


class NotApplicable(Exception):
    """The graph does not meet the rewrite's precondition; the message says why."""


def apply(name: str, gm, args):
    """The traced aten graph `gm` with rewrite `name` applied, traced again on `args` (fresh metadata, and eager
    checks of every view the rewrite made). Raises NotApplicable with the precondition's reason."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    mod = importlib.import_module(REWRITES[name].module)
    why = mod.precondition(gm)
    if why:
        raise NotApplicable(why)
    if not mod.apply(gm):
        raise NotApplicable("the precondition held but nothing was rewritten")
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    with torch.no_grad():
        return make_fx(gm, tracing_mode="real")(*args)
