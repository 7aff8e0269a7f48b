"""Cheats on graphs that update their inputs in place (a BatchNorm forward's running statistics, an optimizer's
step): each the captured wrapper edited so the static screen has nothing to flag. Used by tests/test_mutating.py
on the CPU and tests/gpu/test_corpus_gpu.py on a GPU."""

from __future__ import annotations

import re

from tests.gate_helpers import _after_clear


def stops_updating_after_n_calls(text: str, n: int = 16) -> str:
    """Right for its first n calls (the correctness sets run there), then returns at once: no update, no output.
    Made for a graph with no outputs (an optimizer step), where the update is all the work; the gate timed such
    a step at 10.7x (accepted) while each sample's parameters were held in one buffer and never checked."""
    assert re.search(r"^        return \(\)$", text, re.M), "expected a graph with no outputs"
    return _after_clear(text, f"self.partitions.append(None)\nif len(self.partitions) > {n}:\n    return ()")


def updates_copies_instead(text: str) -> str:
    """Each input the original updates in place is swapped for a copy of itself as the call starts: every kernel
    runs as before on the same values, the outputs are the original's, and the caller's running statistics (or
    parameters) are never updated."""
    names = sorted(_updated_names(text))
    assert names, "the FX program copies into no input"
    return _after_clear(text, "\n".join(f"{n} = {n}.clone()" for n in names))


def updates_twice(text: str) -> str:
    """The whole original call made twice on the same inputs: each update made twice, the outputs the second
    call's (a BatchNorm forward's outputs do not depend on its running statistics: only the update differs)."""
    return text.rstrip("\n") + ("\n\n_call_once = call\n\n\ndef call(args):\n    _call_once(list(args))\n"
                                "    return _call_once(args)\n")


def _updated_names(text: str) -> set[str]:
    """The wrapper's names of the inputs its FX program copies into (`copy_` of a placeholder)."""
    return set(re.findall(r"aten\.copy_\.default\((\w+),", text))
