"""The static screen (stage 1) on real Inductor wrappers and on cheat snippets; no workers run."""

from __future__ import annotations

import pytest

from tests import gate_helpers as h
from tilesmith.gate.static import screen


def _codes(text: str) -> set[str]:
    return {f.code for f in screen(text)}


def test_static_screen_passes_every_wrapper_inductor_generated_for_the_examples(inference_ws, training_ws):
    wrappers = [g / "wrapper.py" for ws in (inference_ws, training_ws) for g in sorted((ws / "graphs").iterdir())]
    assert len(wrappers) >= 5  # inference + two forward and two backward graphs
    for w in wrappers:
        assert screen(w.read_text()) == [], w


@pytest.mark.parametrize("name", sorted(h.STATIC_CHEATS))
def test_static_screen_flags_each_cheat_construct_with_its_code(inference_ws, name):
    code, snippet = h.STATIC_CHEATS[name]
    original = (h.graph_of(inference_ws) / "wrapper.py").read_text()
    assert code in _codes(h.with_module_code(original, snippet))


@pytest.mark.parametrize("snippet,code", [
    ("def call(args):\n    import threading\n    return args", "static-threads"),
    ("def call(args):\n    return getattr(args, '_' + 'x')", "static-dynamic-code"),
    ("def call(args):\n    return __builtins__", "static-dynamic-code"),
    ("def call(args):\n    return args[0].__class__.__subclasses__()", "static-patching"),
    # the cudagraph trees the gate times candidates through (and the program runs them through)
    ("from torch._inductor import cudagraph_trees as ct\nct.CUDAGraphNode.check_invariants = None\n"
     "def call(args):\n    return args", "static-patching"),
    ("import torch._inductor.compile_fx\ndef call(args):\n    return args", "static-patching"),
    ("import torch\ndef call(args):\n    torch._inductor.config.triton.cudagraph_trees = False\n    return args",
     "static-patching"),
    ("def call(args, _seen=[]):\n    _seen.append(1)\n    return args", "static-module-state"),
    ("import torch\n_out = torch.empty(4)\ndef call(args):\n    return (_out,)", "static-module-state"),
    ("from os import environ\ndef call(args):\n    return environ", "static-environment"),
    ("import torch\ndef call(args):\n    torch.cuda.Event(enable_timing=True)\n    return args", "static-streams"),
    ("def call(args):\n    return args\nk = async_compile.cpp_pybinding(['float*'], r'''#include <thread>\n"
     "extern \"C\" void kernel(float* p) { std::thread t([]{}); t.join(); }''')", "static-native"),
    ("def call(args):\n    return args\nimport importlib\nimportlib.import_module('os')", "static-dynamic-code"),
    ("def call(args):\n    return eval('args')", "static-dynamic-code"),
    ("def call(args):\n    return os.getenv('HOME')", "static-environment"),
    ("def call(args):\n    return args\ndef call(args:", "static-syntax"),
    ("def kernel(args):\n    return args", "static-no-call"),
])
def test_static_screen_flags_snippets(snippet, code):
    assert code in _codes(snippet)


def test_static_screen_allows_plain_torch_code_in_call():
    src = ("import torch\nfrom torch._inductor.select_algorithm import extern_kernels\n"
           "def call(args):\n    a, b = args\n    args.clear()\n    out = torch.empty_strided((4, 4), (4, 1))\n"
           "    extern_kernels.mm(a, b, out=out)\n    return (torch.tanh(out), )\n")
    assert screen(src) == []
