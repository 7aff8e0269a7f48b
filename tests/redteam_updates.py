"""Cheats on graphs that update their inputs in place (a BatchNorm forward's running statistics, an optimizer's
step): each the captured wrapper edited so the static screen has nothing to flag. Used by tests/test_mutating.py
on the CPU and tests/gpu/test_corpus_gpu.py on a GPU."""

from __future__ import annotations

import re

CLEAR = "        args.clear()\n"


def _after_clear(text: str, code: str) -> str:
    assert CLEAR in text
    return text.replace(CLEAR, CLEAR + "".join(f"        {line}\n" for line in code.strip("\n").splitlines()), 1)


def stops_updating_after_n_calls(text: str, n: int = 16) -> str:
    """Right for its first n calls (the correctness sets run there), then returns at once: no update, no output.
    Made for a graph with no outputs (an optimizer step), where the update is all the work; the gate timed such
    a step at 10.7x (accepted) while each sample's parameters were held in one buffer and never checked."""
    assert re.search(r"^        return \(\)$", text, re.M), "expected a graph with no outputs"
    return _after_clear(text, f"self.partitions.append(None)\nif len(self.partitions) > {n}:\n    return ()")


def updates_on_scratch_copies(text: str) -> str:
    """Every kernel call that writes an input in place writes a copy of it instead: the outputs are the
    original's, the running statistics (or parameters) are never updated."""
    names = _updated_names(text)
    out, n = [], 0
    for line in text.splitlines(keepends=True):
        m = re.match(r"^(        )(\w+)\((.*)\)\n$", line)
        if m and m.group(2).startswith(("cpp_fused", "triton_")) and any(a in names for a in _args(m.group(3))):
            args = _args(m.group(3))
            seen = [a for a in dict.fromkeys(args) if a in names]
            out += [f"{m.group(1)}_scratch_{a} = {a}.clone()\n" for a in seen]
            # inputs read before they are written keep their first position; every later one writes the copy
            firsts = {}
            new = [a if a not in names or firsts.setdefault(a, i) == i else f"_scratch_{a}" for i, a in enumerate(args)]
            line = f"{m.group(1)}{m.group(2)}({', '.join(new)})\n"
            n += 1
        out.append(line)
    assert n, "no kernel call writes an input in place"
    return "".join(out)


def updates_twice(text: str) -> str:
    """The whole original call made twice on the same inputs: each update made twice, the outputs the second
    call's (a BatchNorm forward's outputs do not depend on its running statistics: only the update differs)."""
    return text.rstrip("\n") + ("\n\n_call_once = call\n\n\ndef call(args):\n    _call_once(list(args))\n"
                                "    return _call_once(args)\n")


def _updated_names(text: str) -> set[str]:
    """The wrapper's names of the inputs its FX program copies into (`copy_` of a placeholder)."""
    return set(re.findall(r"aten\.copy_\.default\((\w+),", text))


def _args(s: str) -> list[str]:
    return [a.strip() for a in s.split(",") if a.strip()]
