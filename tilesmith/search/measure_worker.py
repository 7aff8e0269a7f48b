"""Worker for tilesmith.search.measure: loads each variant, times them in rotating order, prints raw ns."""

from __future__ import annotations

import json
import sys
import time

import torch

from tilesmith.capture import loading
from tilesmith.gate import clock


def main(spec_file: str) -> dict:
    spec = json.loads(open(spec_file).read())
    data = loading.load_graph_data(spec["graph_dir"])
    args = loading.clone_args(data.inputs)
    sync = clock.device_sync(clock.device_of(args))
    reset = loading.state_reset(data, args)  # a graph that updates inputs: each call from the captured state
    calls, results = [], []
    for path in spec["sources"]:
        try:
            mod = loading.load_module(open(path).read(), data.constants)
            with torch.no_grad():
                for _ in range(3):
                    if reset:
                        reset()
                    mod.call(list(args))
                sync()
            calls.append(mod.call)
            results.append({"ns": []})
        except Exception as e:  # a variant that does not compile or run is reported, not fatal
            calls.append(None)
            results.append({"ns": [], "error": f"{type(e).__name__}: {e}"[:300]})
    # calls per sample: enough that one sample lasts ~1 ms, so timer resolution does not matter.
    live = [c for c in calls if c is not None]
    per = 1
    if reset:
        reset()
    elif live:
        with torch.no_grad():
            per = clock.calls_per_sample(lambda: live[0](list(args)), sync, sample_ms=1.0, most=1000)
    deadline = time.monotonic() + spec["budget_s"]
    rnd = 0
    with torch.no_grad():
        while time.monotonic() < deadline or rnd < 3:
            order = list(range(len(calls)))
            order = order[rnd % len(order):] + order[: rnd % len(order)]  # rotate who goes first
            for i in order:
                if calls[i] is None:
                    continue
                if reset:
                    reset()
                    sync()
                ns = clock.timed(lambda: calls[i](list(args)), per, sync)
                results[i]["ns"].append(ns / per)
            rnd += 1
            if rnd >= 200:
                break
    return {"results": results, "calls_per_sample": per}


if __name__ == "__main__":
    loading.reply(main(sys.argv[1]))
