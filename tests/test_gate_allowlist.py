"""The static stage's allowlist (tilesmith.gate.allowlist, allowlist_kernel, allowlist_native): every honest wrapper
and known-good candidate passes unchanged (real captures, the H100 corpus, the tuner's and re-lowering's own output,
the skills' worked rewrites), and every cheat of issue 35 and every red-team cheat the syntax tree can tell apart is
rejected, Python by its tree, C++ by the library the compiler built. Parse-only tests run no worker."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sysconfig
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import corpus, redteam
from tests import gate_helpers as h
from tests import redteam_static as RS
from tests.conftest import FIXTURES, captured_workspace, finished_captures
from tilesmith.gate import allowlist, allowlist_native as N, static
from tilesmith.gate.allowlist_kernel import check_source
from tilesmith.search import kernels as K
from tilesmith.search.tuner import graphed_text

GPU = sorted((FIXTURES / "gpu_wrappers").glob("*.py.gz"))


def gpu_text(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode()


def codes(text: str) -> set[str]:
    return {f.code for f in allowlist.check(text)}


def assert_passes(text: str, what: str = "") -> None:
    found = allowlist.check(text)
    assert found == [], (what, [(f.code, f.line, f.message) for f in found[:5]])


def with_every_kernel_varied(text: str) -> str:
    """The wrapper with each kernel replaced by the tuner's first variant of it (Triton configs, C++ threads), each
    variant's own source checked on the way."""
    for k in reversed(K.find_kernels(text)):
        variants = K.variants(k)
        for label, code in variants:
            if k.kind != "cpp":
                assert check_source(code) == [], (k.name, label)
        if variants:
            text = K.replace_kernel(text, k, variants[0][1])
    return text


# -- the honest corpus: Inductor's own wrappers and the known-good candidates ---------------------------------------

@pytest.mark.parametrize("path", GPU, ids=[p.name.removesuffix(".py.gz") for p in GPU])
def test_every_h100_wrapper_its_whole_call_replay_and_every_tuner_variant_pass_the_allowlist(path):
    text = gpu_text(path)
    assert "async_compile.triton(" in text and "import triton.language as tl" in text
    assert_passes(text, path.name)
    assert_passes(graphed_text(text), "graphed")
    assert_passes(with_every_kernel_varied(text), "kernel variants")


CPU_CORPUS = {
    "inference": "inference_ws", "training": "training_ws", "oversubscribed": "oversub_ws",
    "moe": (corpus.entry("moe", "cpu").script, *corpus.entry("moe", "cpu").args),
    "bf16_matmul": (FIXTURES / "bf16_matmul.py", "--device", "cpu"), "ineligible": (FIXTURES / "ineligible.py",),
    "router_topk": (FIXTURES / "router_topk.py",), "slow_matmul": (FIXTURES / "slow_matmul.py",),
    "slow_pointwise": (FIXTURES / "slow_pointwise.py",), "slow_two_matmuls": (FIXTURES / "slow_two_matmuls.py",),
    "two_matmuls_vectorized": (FIXTURES / "slow_two_matmuls.py", "--vectorized"),
    "token_ids": (FIXTURES / "token_ids.py",),
    # the gate corpus's own captures (tests/corpus.py), shared with tests/test_gate_corpus.py in one test process
    **{n: (corpus.entry(n, "cpu").script, *corpus.entry(n, "cpu").args) for n in ("gpt2", "llama", "gpt2-train", "llama-train")},
}


@pytest.mark.parametrize("name", sorted(CPU_CORPUS))
def test_every_wrapper_the_cpu_suite_captures_passes_the_allowlist_with_its_replay_and_variants(
        name, request, tmp_path_factory, inductor_cache):
    spec = CPU_CORPUS[name]
    ws = request.getfixturevalue(spec) if isinstance(spec, str) else captured_workspace(tmp_path_factory, name, *spec)
    wrappers = sorted((ws / "graphs").glob("*/wrapper.py"))
    assert wrappers
    for w in wrappers:
        text = w.read_text()
        assert_passes(text, w)
        assert_passes(graphed_text(text), "graphed")
        assert_passes(with_every_kernel_varied(text), "kernel variants")


def test_every_library_inductor_built_for_the_captures_passes_the_native_allowlist(inductor_cache, inference_ws,
                                                                                      training_ws, tmp_path_factory):
    # The cache is the run's, shared with the other test process, whose gate tests compile candidates into it (the
    # red team's too): the libraries checked are those built for this run's finished captures, each found by its
    # source beside it (NAME.cpp: a kernel's code as the wrapper has it, then Inductor's binding; or one of the
    # programs Inductor builds to probe the CPU's vector instructions).
    captures = finished_captures(tmp_path_factory)
    assert inference_ws in captures and training_ws in captures
    sources = {lib: lib.with_suffix(".cpp") for lib in Path(inductor_cache).rglob("*.so")}
    sources = {lib: src.read_text() for lib, src in sources.items() if src.exists()}
    kernels, probes = _cpp_kernels(*captures), _inductor_isa_probes()
    libs = sorted(lib for lib, src in sources.items() if src.strip() in probes or any(k in src for k in kernels))
    for k in _cpp_kernels(inference_ws, training_ws):  # each C++ kernel of the two examples has its library here
        assert any(k in sources[lib] for lib in libs), k[:300]
    assert len(libs) >= 5  # the inference example's three kernels, the training graphs' more
    assert any(sources[lib].strip() in probes for lib in libs)  # at least the probe Inductor runs before any kernel
    for lib in libs:
        data = lib.read_bytes()
        assert N.check_library(data) == [], lib
        parsed = N.read_library(data)
        if "getenv" in parsed.imports:  # Inductor's binding: one call each, in PyInit_kernel
            assert (N.call_sites(parsed, "getenv"), N.call_sites(parsed, "strtoull")) == (1, 1), lib


def _cpp_kernels(*workspaces: Path) -> set[str]:
    """The code of every C++ kernel in the captured wrappers of `workspaces`."""
    return {k.code.strip() for ws in workspaces for w in (ws / "graphs").glob("*/wrapper.py")
            for k in K.find_kernels(w.read_text()) if k.kind == "cpp"}


def _inductor_isa_probes() -> set[str]:
    """The C++ programs Inductor compiles into its cache to find the CPU's vector instructions (the `*_code` of
    torch/_inductor/cpu_vec_isa.py's ISA classes)."""
    from torch._inductor import cpu_vec_isa

    return {v.strip() for c in vars(cpu_vec_isa).values() if isinstance(c, type)
            for name, v in vars(c).items() if name.endswith("_code") and isinstance(v, str)}


def test_known_good_rewrites_pass_the_allowlist(inference_ws, slow_matmul_graph):
    text = (h.graph_of(inference_ws) / "wrapper.py").read_text()
    for make in (corpus.makes_a_namedtuple_at_first_call, corpus.imports_a_module_lazily,
                 lambda t: h.with_redundant_work(t, 3)):
        assert_passes(make(text), make)
    assert_passes(h.mm_instead_of_loops((slow_matmul_graph / "wrapper.py").read_text()), "mm_instead_of_loops")


def test_a_relowered_wrapper_with_the_sorted_topk_helper_passes_the_allowlist(tmp_path_factory, inductor_cache):
    from tilesmith.search import relower

    gdir = h.graph_of(captured_workspace(tmp_path_factory, "ws-router-allowlist", FIXTURES / "router_topk.py"))
    variants = [v for v in relower.GPU_VARIANTS if v.trace] + [relower.Variant("aggressive fusion",
                                                                               {"aggressive_fusion": True})]
    lowered = relower.lower_variants(gdir, variants, jobs=1)
    assert [lw.variant.label for lw in lowered if lw.text] == [v.label for v in variants], [lw.reason for lw in lowered]
    for lw in lowered:
        assert "aten.sort.stable" in lw.text or lw.variant.trace == ""
        assert_passes(lw.text, lw.variant.label)


def test_every_python_block_the_skills_allow_passes_the_allowlist_in_a_real_wrapper(inference_ws):
    from tests.test_agent_skills import blocks

    moe = gpu_text(FIXTURES / "gpu_wrappers" / "moe.py.gz")
    header = moe[:moe.index("\n# kernel path")]  # Inductor's imports and aliases, which the fragments use
    real = (h.graph_of(inference_ws) / "wrapper.py").read_text()
    allowed = [b for b in blocks() if b["lang"] == "python" and "allowed" in b["tags"]]
    assert len(allowed) >= 14
    for b in allowed:
        if b.get("real") == "inference-cpu":  # applied to the captured wrapper, as the skill tells the agent
            if b["role"] == "after":
                before = next(x for x in blocks() if x.get("id") == b["id"] and x.get("role") == "before")
                assert before["code"] in real
                assert_passes(real.replace(before["code"], b["code"]), b["id"])
        else:
            assert_passes(header + "\n" + b["code"], (b["skill"], b.get("id"), b.get("role")))


def test_a_wrapper_that_runs_chains_side_by_side_with_the_stream_helper_passes_the_allowlist():
    moe = gpu_text(FIXTURES / "gpu_wrappers" / "moe.py.gz")
    header = moe[:moe.index("\n# kernel path")]
    assert_passes(header + '''
from tilesmith.streams import side_by_side


def _router(x, w):
    logits = extern_kernels.mm(x, w)
    return torch.topk(logits, 2, dim=-1)


def _experts(x, w1):
    return torch.nn.functional.gelu(x @ w1)


def call(args):
    x, w, w1 = args
    args.clear()
    (vals, idx), h = side_by_side((_router, (x, w)), (_experts, (x, w1)))
    return (vals, idx, h)
''')


# -- cheats ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("maker", [m for m, (_, where) in RS.CHEATS.items() if where == "python"],
                         ids=lambda m: m.__name__)
def test_each_issue_35_cheat_passes_the_denylist_and_the_allowlist_rejects_it(inference_ws, maker):
    text = maker((h.graph_of(inference_ws) / "wrapper.py").read_text())
    assert static.screen(text) == []  # what it was written to get past
    assert RS.CHEATS[maker][0] in codes(text)


def test_the_cpp_spinner_is_clean_python_and_the_gate_rejects_its_library_once_the_worker_built_it(
        inference_ws, tmp_path):
    from tilesmith.gate import Policy, judge

    graph = h.graph_of(inference_ws)
    text = RS.cpp_kernel_starts_a_spinner((graph / "wrapper.py").read_text())
    assert static.screen(text) == [] and allowlist.check(text) == []  # nothing in the source says pthread_create
    cand = tmp_path / "spinner.py"
    cand.write_text(text)
    v = judge(graph, cand, Policy(correctness_only=True))
    assert not v.accepted and v.stage == "load", v.reasons
    assert [r.code for r in v.reasons] == ["allowlist-native-symbol"] and "pthread_create" in v.reasons[0].message


# What the syntax tree cannot tell from honest code: pure tensor logic on state a wrapper has anyway (the Runner's
# own list, a closure, the values of its inputs). The dynamic defences catch these (tests/test_gate_redteam.py).
REDTEAM_UNSEEN = {"stale_after_n_on_the_runner", "stale_after_n_in_a_closure", "degrades_every_kth_call",
                  "remembers_outputs_by_input_content", "remembers_outputs_by_address_and_first_value",
                  "misbehaves_only_with_the_captured_weights"}


def _redteam_made(text: str) -> dict[str, str]:
    out = {}
    for name in dir(redteam):
        fn = getattr(redteam, name)
        if name.startswith("_") or not callable(fn) or getattr(fn, "__module__", "") != redteam.__name__:
            continue
        if name == "escapes":
            out[name] = fn(text, "/tmp", "/x", "/y", "http://127.0.0.1:9/")
        elif name == "misbehaves_only_with_the_captured_weights":
            out[name] = fn(text, "arg3_1", [0.5], "arg2_1", [0.25], 1.0)
        else:
            out[name] = fn(text)
    return out


def test_every_red_team_cheat_the_tree_can_tell_apart_is_rejected_and_the_rest_is_plain_tensor_logic(inference_ws):
    made = _redteam_made((h.graph_of(inference_ws) / "wrapper.py").read_text())
    assert len(made) >= 30
    seen = {name for name, text in made.items() if codes(text)}
    assert set(made) - seen == REDTEAM_UNSEEN


_HEADER = "import torch\nimport os\nfrom ctypes import c_void_p, c_long\nimport triton\nimport triton.language as tl\n" \
          "from torch._inductor.select_algorithm import extern_kernels\naten = torch.ops.aten\n"


@pytest.mark.parametrize("body,code", [
    ("x = getattr(torch, 'os')", "allowlist-attribute"),
    ("x = getattr(torch, name)", "allowlist-dynamic-code"),
    ("x = getattr(args[0], '_base')", "allowlist-dynamic-code"),
    ("setattr(torch.Tensor, 'detach', None)", "allowlist-dynamic-code"),
    ("x = torch.ops.load_library('/tmp/x.so')", "allowlist-attribute"),
    ("x = aten.mm.default.py_impl", "allowlist-attribute"),
    ("x = aten.mm.py_impl", "allowlist-attribute"),
    ("x = torch.ops.higher_order.cond", "allowlist-attribute"),
    ("x = torch.from_file('/etc/passwd', size=4)", "allowlist-attribute"),
    ("m = torch.cuda\nx = m.os", "allowlist-attribute"),
    ("x = [torch][0].os", "allowlist-attribute"),
    ("x = torch._C._get_tracing_state()", "allowlist-attribute"),
    ("x = torch.library.Library('aten', 'IMPL')", "allowlist-attribute"),
    ("x = torch.utils.cpp_extension.load_inline", "allowlist-attribute"),
    ("x = torch.jit.CompilationUnit('def f(): pass')", "allowlist-attribute"),
    ("x = torch.empty(4).untyped_storage().from_file('/etc/passwd')", "allowlist-attribute"),
    ("x = torch.empty(4).numpy().tofile('/tmp/x')", "allowlist-attribute"),
    ("x = torch.empty(4).share_memory_()", "allowlist-attribute"),
    ("x = args[0].__class__.__subclasses__()", "allowlist-attribute"),
    ("x = extern_kernels.__dict__", "allowlist-attribute"),
    ("x = c_long.from_address(0)", "allowlist-name"),
    ("x = os.environ", "allowlist-name"),
    ("exec(bytes.fromhex('7072696e74283129').decode())", "allowlist-dynamic-code"),
    ("x = eval('1')", "allowlist-dynamic-code"),
    ("x = __import__('os')", "allowlist-dynamic-code"),
    ("x = vars(torch)", "allowlist-dynamic-code"),
    ("x = type('T', (torch.Tensor,), {})", "allowlist-name"),
    ("print(args)", "allowlist-name"),
    ("raise SystemExit(0)", "allowlist-name"),
    ("args[0].data = torch.zeros(1)", "allowlist-attribute"),
    ("torch.ops.aten.mm.default.tags = []", "allowlist-attribute"),
    ("import operator\nx = operator.attrgetter('os')(torch)", "allowlist-import"),
    ("import functools\nx = functools.reduce(getattr, ['os'], torch)", "allowlist-import"),
    ("import torch.utils._pytree", "allowlist-import"),
    ("from torch._dynamo import utils", "allowlist-import"),
    ("from torch import *", "allowlist-import"),
    ("import importlib", "allowlist-import"),
    ("import tilesmith.runtime", "allowlist-import"),
    ("from tilesmith.cudagraph import _graphs", "allowlist-import"),
    ("x = tl.core", "allowlist-attribute"),
    ("x = triton.runtime.driver", "allowlist-attribute"),
    ("x = get_args()", "allowlist-name"),
])
def test_allowlist_rejects_what_a_wrapper_never_needs_however_it_is_spelled(body, code):
    text = _HEADER + "def call(args):\n" + "".join(f"    {line}\n" for line in body.splitlines()) + "    return ()\n"
    assert code in codes(text), allowlist.check(text)


@pytest.mark.parametrize("src,code", [
    ("def torch():\n    pass", "allowlist-name"),  # rebinds an imported module
    ("def call(args, torch=None):\n    return torch.os", "allowlist-name"),
    ("class T(torch.Tensor):\n    pass", "allowlist-syntax"),
    ("class T:\n    def __torch_function__(self, *a):\n        pass", "allowlist-name"),
    ("class T:\n    @staticmethod\n    def f(o, v):\n        o.detach = v", "allowlist-syntax"),
    ("class T:\n    def f(self, v):\n        self = torch.Tensor\n        self.detach = v", "allowlist-name"),
    ("class T:\n    def f(self, v):\n        self.detach = v\nT.f(torch.Tensor, None)", "allowlist-attribute"),
    ("class T:\n    def add(self, v):\n        self.detach = v\nt = T\nt.add(torch.Tensor, None)", "allowlist-name"),
    ("__name__ = '__main__'", "allowlist-name"),
    ("def __getattr__(name):\n    return name", "allowlist-name"),
    ("aten = torch.ops.prims", "allowlist-name"),
    ("async def call(args):\n    return args", "allowlist-syntax"),
    ("k = async_compile.cpp_pybinding(['float*>(args, 0)); system(\"x\"); (parse_arg<float*'], '''x''')",
     "allowlist-kernel"),
    ("src = 'x'\nk = async_compile.triton('k', src, device_str='cuda')", "allowlist-kernel"),
])
def test_allowlist_rejects_module_level_constructs_a_wrapper_never_has(src, code):
    text = _HEADER + "from torch._inductor.async_compile import AsyncCompile\nasync_compile = AsyncCompile()\n" + src + "\n"
    assert code in codes(text), allowlist.check(text)


_KERNEL = gpu_text(FIXTURES / "gpu_wrappers" / "moe.py.gz")


def _a_triton_kernel() -> str:
    (k,) = [k for k in K.find_kernels(_KERNEL) if k.name.endswith("_0")]
    return k.code


@pytest.mark.parametrize("edit,code", [
    (lambda s: "import os\n" + s, "allowlist-import"),
    (lambda s: s.replace("import triton\n", "import triton\nimport triton.runtime\n", 1), "allowlist-import"),
    (lambda s: s.replace("triton_helpers.set_driver_to_gpu()", "triton_helpers.set_driver_to_gpu()\nprint(1)"),
     "allowlist-kernel"),
    (lambda s: s.replace("'grid_type': 'Grid1D'", "'fixed_grid': ['1); import os; (1', '1', '1'], 'grid_type': 'Grid1D'"),
     "allowlist-kernel"),
    (lambda s: s.replace("'autotune_remote_cache': None", "'autotune_remote_cache': True"), "allowlist-kernel"),
    (lambda s: s.replace("'out_ptr0': '*bf16'", "'out_ptr0, stream): import os #': '*bf16'"), "allowlist-kernel"),
    (lambda s: s.replace("@triton.jit", "@triton.jit(launch_metadata=print)"), "allowlist-kernel"),
    (lambda s: s.replace("xnumel = 2048", "xnumel = getattr(tl, 'core')"), "allowlist-attribute"),
    (lambda s: s.replace("xnumel = 2048", "xnumel = tl.core.builtins"), "allowlist-attribute"),
    (lambda s: s.replace("xnumel = 2048", "xnumel = (lambda: 2048)()"), "allowlist-kernel"),
    (lambda s: s.replace("tl.store(", "tl.store.__globals__; tl.store("), "allowlist-attribute"),
    (lambda s: s.replace("filename=__file__", "filename='/tmp/x'"), "allowlist-kernel"),
    # of triton.language.extra, only programmatic dependent launch's two calls (tests/fixtures/gpu_wrappers/decode-pdl):
    # not the GPU's clock, which a kernel could read to tell the gate's runs from the program's
    (lambda s: s.replace("xnumel = 2048", "xnumel = tl.extra.cuda.globaltimer()"), "allowlist-attribute"),
    (lambda s: s.replace("xnumel = 2048", "xnumel = tl.extra.cuda.libdevice.abs(1)"), "allowlist-attribute"),
])
def test_a_triton_kernel_source_is_checked_as_the_python_module_it_is(edit, code):
    src = _a_triton_kernel()
    assert check_source(src) == []
    assert code in {f.code for f in check_source(edit(src))}, check_source(edit(src))


_TEMPLATE_GRID = ("'grid_type': 'FixedGrid', 'fixed_grid': ['_grid_0', '_grid_1', '_grid_2'], "
                  "'extra_launcher_args': ['_grid_0', '_grid_1', '_grid_2']")
_PRECOMPUTED = ("'grid_type': 'PrecomputedGrid', 'precomputed_grids': [{'config': {'BLOCK': 64}, 'python': "
                "['-(-s0 // 64)', '1', '1'], 'cpp': ['-(-s0 / 64)', '1', '1'], 'python_slow': ['-(-s0 // 64)', '1', "
                "'1']}], 'extra_launcher_args': ['_launcher_s0']")


def test_a_kernels_grid_given_as_names_or_arithmetic_passes_and_one_given_as_code_does_not():
    """Templates (max-autotune) launch on a grid passed as arguments, user Triton kernels on grids Inductor computed:
    the autotuner pastes both into the launcher it exec()s, so names and arithmetic pass and nothing else does."""
    src = _a_triton_kernel()
    for grid in (_TEMPLATE_GRID, _PRECOMPUTED):
        assert check_source(src.replace("'grid_type': 'Grid1D'", grid)) == [], grid
    for bad in (_TEMPLATE_GRID.replace("'_grid_0', '_grid_1'", "'os.system', '_grid_1'"),
                _PRECOMPUTED.replace("'-(-s0 // 64)', '1'", "\"__import__('os').system('true')\", '1'")):
        assert "allowlist-kernel" in {f.code for f in check_source(src.replace("'grid_type': 'Grid1D'", bad))}, bad


def test_switching_the_screen_off_switches_the_whole_static_stage_off(monkeypatch, tmp_path):
    cheat = _HEADER + "def call(args):\n    return torch.os.getpid()\n"
    worker = SimpleNamespace(proc=SimpleNamespace(pid=os.getpid()), dir=tmp_path)
    assert "allowlist-attribute" in {f.code for f in static.allowlist(cheat)}
    monkeypatch.setattr(static, "screen", lambda text: [])  # what tests/test_gate_redteam.py does
    assert static.allowlist(cheat) == [] and static.native(worker) == []


# -- native: what the compiler built ------------------------------------------------------------------------------

_NATIVE = {
    "honest": ("", '#include <cmath>\nextern "C" void kernel(float* out) {\n#pragma omp parallel for\n'
                   "    for (long i = 0; i < 64; ++i) out[i] = std::exp(out[i]) + std::tanh(out[i]);\n}\n"),
    "pasted-pthread": ("allowlist-native-symbol", "#include <pthread.h>\n#define GLUE(a, b) a##b\n"
                       "void* spin(void*) { for (;;) {} return nullptr; }\n"
                       'extern "C" void kernel(float* out) { pthread_t t; GLUE(pthread_, create)(&t, nullptr, spin, '
                       "nullptr); }\n"),
    "std-thread": ("allowlist-native-symbol", '#include <thread>\nextern "C" void kernel(float* out) '
                                              "{ std::thread([] {}).detach(); }\n"),
    "raw-syscall": ("allowlist-native-syscall", 'extern "C" void kernel(float* out) { long r; asm volatile("syscall" '
                                                ': "=a"(r) : "a"(39L) : "rcx", "r11", "memory"); out[0] = r; }\n'),
    "second-getenv": ("allowlist-native-symbol", '#include <cstdlib>\nextern "C" void kernel(float* out) '
                                                 '{ out[0] = std::getenv("TILESMITH_VERIFY") ? 1.f : 0.f; }\n'),
    "environ": ("allowlist-native-symbol", '#include <unistd.h>\nextern "C" void kernel(float* out) '
                                           "{ out[0] = environ[0][0]; }\n"),
    "sysv-shm": ("allowlist-native-symbol", '#include <sys/shm.h>\nextern "C" void kernel(float* out) '
                                            "{ out[0] = shmget(0x7473, 4096, IPC_CREAT | 0600); }\n"),
    "file-write": ("allowlist-native-symbol", '#include <cstdio>\nextern "C" void kernel(float* out) '
                                              '{ FILE* f = fopen("/tmp/k", "w"); if (f) { fputs("k", f); fclose(f); } }\n'),
    "alarm": ("allowlist-native-symbol", "#include <csignal>\n#include <sys/time.h>\nvoid on_alarm(int) {}\n"
                                         'extern "C" void kernel(float* out) { signal(SIGALRM, on_alarm); itimerval t{}; '
                                         "t.it_value.tv_usec = 1000; setitimer(ITIMER_REAL, &t, nullptr); }\n"),
    "dlopen": ("allowlist-native-symbol", '#include <dlfcn.h>\nextern "C" void kernel(float* out) '
                                          '{ out[0] = dlopen("libc.so.6", RTLD_NOW) != nullptr; }\n'),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, bytes]:
    """Each _NATIVE kernel with Inductor's own Python binding appended, built as Inductor builds one (g++, -O2,
    -shared, -fPIC, OpenMP): the library's bytes, by name."""
    from torch._inductor.codecache import CppPythonBindingsCodeCache as C

    glue = C.suffix_template.format(arg_len=1, call_entry_func=C.call_entry_function.format("parse_arg<float*>(args, 0)"),
                                    entry_func=C.entry_function, extra_parse_arg=C.extra_parse_arg.format(array_len=1))
    d = tmp_path_factory.mktemp("native")
    out = {}
    for name, (_, kernel) in _NATIVE.items():
        src, lib = d / f"{name}.cpp", d / f"{name}.so"
        src.write_text(kernel + glue)
        subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-fopenmp", "-std=c++17",
                        f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(lib)], check=True,
                       capture_output=True)
        out[name] = lib.read_bytes()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_NATIVE))
def test_a_kernel_library_is_judged_by_what_it_imports_and_contains_not_by_its_source(built, name):
    found = N.check_library(built[name])
    want = _NATIVE[name][0]
    assert [f.code for f in found] == ([want] if want else []), found


def test_a_file_that_is_not_an_elf_library_cannot_be_vouched_for():
    assert [f.code for f in N.check_library(b"#!/bin/sh\necho\n")] == ["allowlist-native-unreadable"]


# -- install ------------------------------------------------------------------------------------------------------

def test_install_refuses_an_accepted_artifact_that_fails_the_allowlist_and_says_what_it_reaches(tmp_path):
    from tests.test_install import KEY, make_run
    from tilesmith import store
    from tilesmith.install import install

    cheat = "import torch\n_mods = torch.sys.modules\n\ndef call(args):\n    args.clear()\n    return ()\n"
    rid = make_run(tmp_path, cheat)
    (g,) = install(rid, dry_run=True).graphs
    assert g.status == "refused" and "torch.sys" in g.reason and "line 2" in g.reason
    (g,) = install(rid).graphs
    assert g.status == "refused" and not store.artifact_path(KEY).exists()
    assert json.loads(json.dumps(install(rid).to_dict()))["graphs"][0]["status"] == "refused"
