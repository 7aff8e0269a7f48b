"""Cheats on graphs that update their inputs in place (a BatchNorm forward's running statistics, an optimizer's
step): each the captured wrapper edited so the static screen has nothing to flag. Used by tests/test_mutating.py
on the CPU and tests/gpu/test_corpus_gpu.py on a GPU."""

from __future__ import annotations

import re

from tests.gate_helpers import _after_clear, _before_return, _return_name


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


def remembers_the_step_by_its_state(text: str, updated: list[int]) -> str:
    """Keeps each call's outputs and the state it left (the inputs at `updated`, graph.json's mutated_inputs) keyed on
    one element of every input (a probe of microseconds), and on a hit writes that state back and returns the outputs
    without computing. A decode step whose other inputs are a token and a position, each with one recorded value,
    sees the same values on every sample if its state (a parameter: one buffer, refilled from the captured values
    before each sample) is refilled unchanged: then every call of every sample after the first answers from memory,
    right on each checked call. In a program, where the cache fills and the tokens change, it never answers."""
    names = re.search(r"^        (\w+(?:, \w+)*) = args$", text, re.M).group(1).split(", ")
    name = _return_name(text)
    state = ", ".join(names[i] for i in updated)
    key = "(" + "".join(f"{a}.reshape(-1)[{a}.numel() // 3].item(), " for a in names) + ")"
    text = _after_clear(text, f"""_key = {key}
_state = ({state}, )
if not self.partitions or len(self.partitions[0]) > 4096:
    self.partitions[:] = [{{}}]
_hit = self.partitions[0].get(_key)
if _hit is not None:
    for _s, _v in zip(_state, _hit[1]):
        _s.copy_(_v)
    return (_hit[0].clone(), )""")
    return _before_return(text, f"self.partitions[0][_key] = ({name}.clone(), [_s.clone() for _s in _state])")
