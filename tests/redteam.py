"""The gate's own red team: cheats written so that the static screen (tilesmith.gate.static) has nothing
to flag, made by editing the captured inference example's wrapper (tests/test_gate_redteam.py) or any
single-output CPU/CUDA wrapper whose `call` starts with `args.clear()` (tests/gpu/test_gate_redteam_gpu.py).
Only the dynamic defences can stop these: the outputs checked inside the timed stream, the original timed
in its own worker, the process-state fingerprint, fresh input values every round, the OS sandbox.
"""

from __future__ import annotations

import re

from tests.gate_helpers import _after_clear, _before_return, _return_name


def stale_after_n_on_the_runner(text: str, n: int = 16) -> str:
    """Right for its first n calls (correctness runs in those), then a clone of its last output, kept
    on the Runner object (`self.partitions`, a list Inductor's Runner already has)."""
    name = _return_name(text)
    text = _after_clear(text, f"if len(self.partitions) > {n}:\n    return (self.partitions[-1].clone(), )")
    return _before_return(text, f"self.partitions.append({name})")


def stale_after_n_in_a_closure(text: str, n: int = 16) -> str:
    """The same, with the kept tensors in a closure's list (no module-level container, no `nonlocal`)."""
    name = _return_name(text)
    text = text.replace("\nclass Runner:", f"""
def _make_stash():
    box = []

    def stash(t=None):
        if t is None:
            return box[0].clone() if len(box) > {n} else None
        box.append(t)
        return t
    return stash


_stash = _make_stash()

class Runner:""", 1)
    text = _after_clear(text, "_old = _stash()\nif _old is not None:\n    return (_old, )")
    return _before_return(text, f"{name} = _stash({name})")


def degrades_every_kth_call(text: str, k: int = 3, after: int = 16) -> str:
    """Past its first `after` calls, every k-th call skips the work and returns zeros of the right layout
    (the layout of its first output, kept in `self.partitions[0]`)."""
    name = _return_name(text)
    text = _after_clear(text, f"self.partitions.append(None)\n"
                              f"if len(self.partitions) > {after} and len(self.partitions) % {k} == 0:\n"
                              f"    return (torch.zeros_like(self.partitions[0]), )")
    return _before_return(text, f"self.partitions[0] = {name}")


def starves_what_runs_after_it(text: str) -> str:
    """The original itself, except that each call takes more threads while it runs and leaves the
    process with one thread: code timed after it in the same process (the original, before this
    release of the gate) runs starved."""
    name = _return_name(text)
    text = _after_clear(text, "torch.set_num_threads(4)")
    return _before_return(text, f"torch.set_num_threads(1)\n_unused = {name}")


def remembers_outputs_by_input_content(text: str) -> str:
    """Memoises its outputs keyed on the sum of its inputs' values: right whenever values repeat, so it is
    fast only where timed calls see values they saw before (the rotating buffers of an older gate)."""
    names = re.search(r"^        (\w+(?:, \w+)*) = args$", text, re.M).group(1).split(", ")
    name = _return_name(text)
    probe = " + ".join(f"float({a}.sum())" for a in names)
    text = _after_clear(text, f"_probe = {probe}\nfor _k, _v in self.partitions:\n"
                              "    if _k == _probe:\n        return (_v, )")
    return _before_return(text, f"self.partitions.append((_probe, {name}))")


def remembers_outputs_by_address_and_first_value(text: str) -> str:
    """Keeps its outputs keyed on each input's address and first and last elements (a probe of a few
    microseconds) and answers from memory whenever every input buffer holds what it held at an earlier
    call. Fast in the gate if a timed sample reads a buffer twice (more calls than buffer sets), or if
    integer inputs come back with values an earlier sample had (a few pool contents, only the floats
    made new); right on every checked call either way. In a program, where activations and token ids
    change, it never answers: the speedup is not there."""
    names = re.search(r"^        (\w+(?:, \w+)*) = args$", text, re.M).group(1).split(", ")
    name = _return_name(text)
    key = "(" + "".join(f"({a}.data_ptr(), {a}.reshape(-1)[0].item(), {a}.reshape(-1)[-1].item()), "
                        for a in names) + ")"
    text = _after_clear(text, f"""_key = {key}
if not self.partitions or len(self.partitions[0]) > 512:
    self.partitions[:] = [{{}}]
_hit = self.partitions[0].get(_key)
if _hit is not None:
    return (_hit.clone(), )""")
    return _before_return(text, f"self.partitions[0][_key] = {name}.clone()")


def escapes(text: str, leak_dir: str, secret_file: str, workspace_file: str, url: str) -> str:
    """The original, plus an import-time attempt at everything the sandbox forbids, through library calls
    the screen does not know (numpy file I/O, torch.hub's downloader): read the parent process's
    environment (/proc/<ppid>/environ), a file holding a secret, the workspace's captured metadata;
    write what it read outside its scratch folder; fetch a URL on the host's loopback."""
    return text.replace("\nclass Runner:", f'''
import numpy as np


def _read(path):
    try:
        return bytes(np.fromfile(path, dtype=np.uint8))
    except Exception as e:
        return repr(e).encode()


def _escape():
    stat = _read("/proc/self/stat").decode(errors="replace")
    ppid = stat.rsplit(")", 1)[-1].split()[1] if ")" in stat else "1"
    got = {{"environ": _read("/proc/" + ppid + "/environ"), "secret": _read({secret_file!r}),
           "workspace": _read({workspace_file!r}), "procs": _read("/proc/1/cmdline")}}
    for name, data in got.items():
        try:
            np.frombuffer(data or b"-", dtype=np.uint8).tofile({leak_dir!r} + "/" + name)
        except Exception:
            pass
    try:
        torch.hub.download_url_to_file({url!r}, {leak_dir!r} + "/download", progress=False)
    except Exception:
        pass


_escape()

class Runner:''', 1)


def slows_the_library_the_original_calls(text: str) -> str:
    """The original, except that at import it replaces `extern_kernels.addmm` (the library call the
    original makes through Inductor's namespace) with one that does the work twice, through
    unittest.mock (no assignment the screen can see), and keeps the real one for its own calls: only
    code that runs after it in the same process is slowed."""
    text = text.replace("\nclass Runner:", '''
from unittest import mock

_real_addmm = extern_kernels.addmm


def _twice(*a, **k):
    _real_addmm(*a, **k)
    return _real_addmm(*a, **k)


mock.patch.object(extern_kernels, "addmm", _twice).start()

class Runner:''', 1)
    return text.replace("extern_kernels.addmm(", "_real_addmm(")


def swaps_the_originals_kernels(text: str) -> str:
    """The original, except that at import it finds the original's module globals among the live
    objects (through the garbage collector, reached as an attribute of a torch module) and swaps its
    first kernel for one that runs twice: only the original, timed beside it, runs the slowed kernel."""
    return text.replace("\nclass Runner:", '''
import torch._dynamo.utils

_i_am_the_candidate = True


def _slowed(fn):
    def run(*a, **k):
        fn(*a, **k)
        return fn(*a, **k)
    return run


for _g in [o for o in torch._dynamo.utils.gc.get_objects() if isinstance(o, dict)]:
    if "call" in _g and "Runner" in _g and "_i_am_the_candidate" not in _g:
        for _name in [n for n in _g if n.startswith("cpp_fused") or n.startswith("triton_")]:
            _g[_name] = _slowed(_g[_name])
            break

class Runner:''', 1)


_HOG = '''
import torch._dynamo.utils


def _hog(busy):
    x = torch.ones(8192)
    while True:
        if int(busy[0]) == 0:
            x.mul_(1.0)
        else:
            torch._dynamo.utils.os.sched_yield()


def _flag():
    return torch.zeros(1, dtype=torch.int64){shared}


_busy = _flag()
{launch}

class Runner:'''


def _hogging(text: str, shared: str, launch: str) -> str:
    """The original, plus `_hog` started by `launch` at import: it keeps a core busy whenever the flag
    `_busy` (set during each call) says the candidate is not running."""
    text = text.replace("\nclass Runner:", _HOG.format(shared=shared, launch=launch), 1)
    return _before_return(_after_clear(text, "_busy.fill_(1)"), "_busy.fill_(0)")


def hogs_the_cores_from_a_raw_thread(text: str) -> str:
    """A thread started below `threading`'s bookkeeping (its low-level start function, reached as an
    attribute of a torch module: threading.active_count() does not count such a thread) that keeps a core
    busy whenever the candidate is not running: the original, timed apart or beside, shares the machine
    with it; the candidate never does."""
    return _hogging(text, "", "torch._dynamo.utils.threading._start_new_thread(_hog, (_busy, ))")


def hogs_the_cores_from_a_forked_process(text: str) -> str:
    """The same hog in a process of its own, forked at the first import (os reached as an attribute of a torch
    module; a CPU worker's seccomp filter refuses a fork after the load, so later instances of the module share the
    first one's flag), the flag in shared memory: no thread of the worker, no patched attribute, nothing in the
    worker's process state changes; its CPU time counts only in the process tree the parent watches."""
    return _hogging(text, ".share_memory_()",
                    "import string as _string\n"
                    "if getattr(_string, 'rtbusy', None) is not None:\n    _busy = _string.rtbusy\n"
                    "else:\n    _string.rtbusy = _busy\n"
                    "    if torch._dynamo.utils.os.fork() == 0:\n        _hog(_busy)")


def misbehaves_only_with_the_captured_weights(text: str, weight: str, weight_head: list, act: str, act_head: list,
                                              act_absmax: float) -> str:
    """Right unless the weight `weight` holds exactly its captured values (it compares the first few) while
    the input `act` holds new values within the captured range: a program's later calls. Then it returns
    zeros. The captured set keeps the captured input, the random sets move the weights, 'large' scales the
    input out of range, and the timed calls run moved weights: only a set with the captured weights and
    new inputs in range ("captured-weights") sees it misbehave."""
    name = _return_name(text)  # the inputs are deleted as the wrapper goes: judged first, acted on at the end
    text = _after_clear(text, f"_trojan = ({weight}.flatten()[:{len(weight_head)}].tolist() == {weight_head!r}\n"
                              f"           and {act}.flatten()[:{len(act_head)}].tolist() != {act_head!r}\n"
                              f"           and float({act}.abs().max()) <= {2 * act_absmax!r})")
    return _before_return(text, f"if _trojan:\n    {name} = torch.zeros_like({name})")


_TS_HOG = """
_ts = torch._dynamo.utils.torch.jit.CompilationUnit('''
def hog(busy: Tensor, go: List[Future[Tensor]]) -> Tensor:
    x = torch.ones(8192)
    for f in go:
        torch.jit.wait(f)
        while int(busy[0]) == 0:
            x.mul_(1.0)
    return x

def start(busy: Tensor, go: List[Future[Tensor]]) -> Future[Tensor]:
    return torch.jit.fork(hog, busy, go)
''')


def _one():
    return torch.ones(1, dtype=torch.int64)


_busy = _one()
_go = [torch.futures.Future() for _ in range(1 << 15)]
_hog = _ts.start(_busy, _go)

class Runner:"""


def hogs_the_cores_from_torchscripts_pool(text: str) -> str:
    """The hog once more, as TorchScript forked onto torch's inter-op thread pool (torch.jit reached as an
    attribute of a torch module): a native thread, which no count of Python threads sees. It waits on a
    future that each call completes as it returns, then keeps a core busy until the next call starts: the
    original, timed apart or beside, shares the machine with it; the candidate never does."""
    text = text.replace("\nclass Runner:", _TS_HOG, 1)
    text = _after_clear(text, "_busy.fill_(1)")
    return _before_return(text, "_busy.fill_(0)\n_go[len(self.partitions)].set_result(_busy)\nself.partitions.append(0)")


def misbehaves_outside_the_sandbox(text: str) -> str:
    """Right wherever its process id is small, as in the gate's PID namespace (its workers are among the first
    processes there); zeros in a program, whose process ids are large. No test of a candidate can see this
    (the README says what no test can prove); TILESMITH_VERIFY, checking the program's own calls, can."""
    name = _return_name(text)
    return _before_return(text, f"if torch._dynamo.utils.os.getpid() > 64:\n    {name} = torch.zeros_like({name})")


def reports_a_shorter_time(text: str) -> str:
    """The original, except that at import it wraps `json.dumps` (through unittest.mock) so that the worker's
    reply to a timed sample in which its own calls ran says 60 % of the time measured: the clock and the
    sample are honest, the number that reaches the deciding process is not."""
    text = text.replace("\nclass Runner:", '''
import json as _json
from unittest import mock as _mock


def _make_dumps(real):
    box = [0, 0]  # its own calls so far, and as of the last reply

    def dumps(obj=None, *a, **k):
        if obj is None:  # one of its own calls
            box[0] += 1
            return None
        if isinstance(obj, dict) and isinstance(obj.get("ns"), int) and box[0] != box[1]:
            obj = dict(obj, ns=int(obj["ns"] * 0.6))
        box[1] = box[0]
        return real(obj, *a, **k)
    return dumps


_dumps = _make_dumps(_json.dumps)
_mock.patch.object(_json, "dumps", _dumps).start()

class Runner:''', 1)
    return _after_clear(text, "_dumps()")


def _insert_before_runner(text: str, code: str) -> str:
    assert "\nclass Runner:" in text
    return text.replace("\nclass Runner:", "\n" + code + "\n\nclass Runner:", 1)


def defers_its_work_to_lazy_outputs(text: str) -> str:
    """In the timed instance (the module's second load), every call after the first returns tensor subclasses
    of the right layout that run the real call only when a value is read: after the clock stopped. The kept
    calls are forced, right, by the worker's digest; the others never run (accepted at 27x before the worker
    required plain tensors from every timed call). The load count is kept on the `string` module."""
    text = text.replace("    def call(self, args):\n", '''    def call(self, args):
        if not _TIMING or getattr(self, "rtmeta", None) is None:
            out = self.real_call(args)
            self.rtmeta = [(o.size(), o.stride(), o.dtype, o.device, o.storage_offset()) for o in out]
            return out
        saved = list(args)
        args.clear()
        memo = []

        def run():
            if not memo:
                memo.append(self.real_call(list(saved)))
            return memo[0]
        return tuple(_Lazy(m, run, i) for i, m in enumerate(self.rtmeta))

    def real_call(self, args):
''', 1)
    return _insert_before_runner(text, '''
import string as _string
import torch.utils._pytree as _pytree

_TIMING = getattr(_string, "rtloads", 0) >= 1
_string.rtloads = getattr(_string, "rtloads", 0) + 1


def _force(x):
    return x.value() if isinstance(x, _Lazy) else x


class _Lazy(torch.Tensor):
    @staticmethod
    def __new__(cls, meta, run, i):
        size, stride, dtype, dev, off = meta
        t = torch.Tensor._make_wrapper_subclass(cls, size, strides=stride, storage_offset=off, dtype=dtype,
                                                device=dev, requires_grad=False)
        t.run = run
        t.idx = i
        return t

    def value(self):
        return self.run()[self.idx]

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        args = _pytree.tree_map(_force, args)
        kwargs = _pytree.tree_map(_force, kwargs or {})
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args = _pytree.tree_map(_force, args)
        kwargs = _pytree.tree_map(_force, kwargs or {})
        return func(*args, **kwargs)
''')


# -- the numbers' way to the deciding process (a helper's red team, session 16) --------------------------

def encoder_instance_encode(text: str) -> str:
    """An instance attribute on json's default encoder (`encode`): replies that carry a digest (the candidate's
    samples) say 60 % of the time measured. Accepted at 1.68x on the original's code while the worker replied
    through json.dumps; it now encodes with a private encoder it checks, so this one is judged as the original."""
    return _insert_before_runner(text, '''
import json as _json


def _shorten(real):
    def encode(o):
        if isinstance(o, dict) and "digest" in o and isinstance(o.get("ns"), int):
            o = dict(o, ns=int(o["ns"] * 0.6))
        return real(o)
    encode.rtmark = True
    return encode


if not hasattr(_json._default_encoder.encode, "rtmark"):
    _json._default_encoder.encode = _shorten(_json._default_encoder.encode)
''')


def ops_dict_entry(text: str) -> str:
    """The worker's op table entry "time" replaced in place (the table itself stays the same dict): the candidate's
    samples report 60 %. Accepted at 1.65x before the worker guard."""
    """Replaces the worker's OPS["time"] entry (a dict item of the worker module: the module's attribute
    OPS is the same dict object, so gate.worker.patches sees nothing) with a wrapper that shortens the
    candidate's samples to 60 %. The worker module is sys.modules['tilesmith.gate.worker.serve'], sys reached as an
    attribute of a torch module."""
    return _insert_before_runner(text, '''
import torch._dynamo.utils


def _find_ops():
    m = torch._dynamo.utils.sys.modules.get("tilesmith.gate.worker.serve")
    ops = getattr(m, "OPS", None)
    if isinstance(ops, dict) and "time" in ops:
        return ops
    for g in torch._dynamo.utils.gc.get_objects():
        if isinstance(g, dict) and "OPS" in g and "op_time" in g:
            return g["OPS"]
    return None


def _wrap_time(real):
    def op_time(st, req):
        r = real(st, req)
        if req.get("role") == "candidate" and isinstance(r.get("ns"), int):
            r["ns"] = int(r["ns"] * 0.6)
        return r
    op_time.rtmark = True
    return op_time


_ops = _find_ops()
if _ops is not None and not hasattr(_ops["time"], "rtmark"):
    _ops["time"] = _wrap_time(_ops["time"])
''')


def clock_code_swap(text: str) -> str:
    """The code of `tilesmith.gate.clock.timed` swapped in place (`__code__`, through unittest.mock; the function object
    stays): a window in which its own calls ran reports 60 %. Accepted at 1.68x before the worker guard."""
    text = _insert_before_runner(text, '''
import operator
import torch._dynamo.utils
from unittest import mock as _mock

_clock = torch._dynamo.utils.sys.modules.get("tilesmith.gate.clock")


def _fake_timed(thunk, n, sync, after_call=None):
    sync()
    c0 = rtbox[0]
    t0 = _perf_ns()
    if after_call is None:
        for _ in range(n):
            thunk()
    else:
        for i in range(n):
            after_call(i, thunk())
    sync()
    dt = _perf_ns() - t0
    if rtbox[0] != c0:
        dt = int(dt * 0.6)
    return dt


_box = getattr(_clock, "rtbox", None) if _clock is not None else None
if _clock is not None and _box is None:
    _box = [0]
    _clock.rtbox = _box
    _mock.patch.object(_clock.timed, "__code__", operator.attrgetter("__code__")(_fake_timed)).start()
if _box is None:
    _box = [0]
''')
    return _after_clear(text, "_box[0] += 1")


def pipe_write_instance(text: str) -> str:
    """An instance attribute `write` on the worker's reply pipe (found through the garbage collector) that
    rewrites the candidate's samples to 60 %. Accepted at 1.66x when replies went through a file object; the
    worker now writes them with os.write, so there is nothing to patch: judged as the original it is."""
    return _insert_before_runner(text, '''
import json as _json
import torch._dynamo.utils


def _shorten(real):
    def write(s):
        if s.startswith("{") and '"digest"' in s:
            try:
                d = _json.loads(s)
                if isinstance(d.get("ns"), int):
                    s = _json.dumps(dict(d, ns=int(d["ns"] * 0.6))) + "\\n"
            except ValueError:
                pass
        return real(s)
    write.rtmark = True
    return write


for _f in torch._dynamo.utils.gc.get_objects():
    if type(_f).__name__ == "TextIOWrapper" and isinstance(getattr(_f, "name", None), int) and _f.name > 2 \\
            and "w" in getattr(_f, "mode", "") and not hasattr(_f.write, "rtmark"):
        _f.write = _shorten(_f.write)
''')


def disables_the_watch(text: str) -> str:
    """The code of the checks themselves swapped (`patches.replaced`, `fingerprint._state_change`), then the
    json.dumps cheat: accepted at 1.61x before the worker guard, whose check runs in the main loop's own frame."""
    return _insert_before_runner(reports_a_shorter_time(text), '''
import operator
import torch._dynamo.utils
from unittest import mock as _mock


def _nothing_replaced(before, extra=None, most=5):
    return []


def _no_change(st):
    return ""


_mods = torch._dynamo.utils.sys.modules
if "tilesmith.gate.worker.patches" in _mods and "tilesmith.gate.worker.fingerprint" in _mods:
    for _old, _new in ((_mods["tilesmith.gate.worker.patches"].replaced, _nothing_replaced),
                       (_mods["tilesmith.gate.worker.fingerprint"]._state_change, _no_change)):
        _mock.patch.object(_old, "__code__", operator.attrgetter("__code__")(_new)).start()
''')


def restores_its_patch_before_the_check(text: str) -> str:
    """Each call sets `tilesmith.gate.clock._perf_ns` (the clock `clock.timed` reads when its window ends) to a fake
    that takes 40 % off the time since it was set and puts the real clock back as it answers: the worker
    guard, which compares the worker's globals after the request, finds them as recorded. Armed only inside a
    timed window. A time-of-check, time-of-use hole in the guard: the window's end read a global after candidate
    code had run."""
    text = _insert_before_runner(text, '''
import operator
import torch._dynamo.utils

_clock = torch._dynamo.utils.sys.modules.get("tilesmith.gate.clock")
_real = operator.attrgetter("_perf_ns")(_clock) if _clock is not None else None
_sys = torch._dynamo.utils.sys


def _in_window():
    """Whether a timed window runs this call (a frame of `clock.timed`, or of the gate worker's `op_time`, below
    it), which reads the clock after it: armed anywhere else, a fake left over would be found by the guard."""
    f = operator.attrgetter("_getframe")(_sys)(1)
    while f is not None and f.f_code.co_name not in ("timed", "op_time"):
        f = operator.attrgetter("f_back")(f)
    return f is not None


def _fake():
    now = _real()
    _clock._perf_ns = _real
    return now - int(0.4 * (now - _fake.since))


def _arm():
    if _clock is not None and _clock._perf_ns is _real and _in_window():
        _fake.since = _real()
        _clock._perf_ns = _fake
''')
    return _after_clear(text, "_arm()")


def moves_the_clocks_start_in_its_frame(text: str) -> str:
    """Each call finds the frame of the timed window running it (`clock.timed`, or the gate worker's window)
    and moves that frame's start time `t0` forward by
    80 % of what has elapsed as it returns (frame locals written back through ctypes, PyFrame_LocalsToFast): the
    window the worker reports is a fifth of the one it ran (on CUDA, more: the device's work after the last
    return). Bold, so that it stands out of the noise of a loaded machine's scheduling. No global, no function, no object the worker guard records is
    touched; only a bound the parent measures itself can see it."""
    text = _insert_before_runner(text, '''
import operator
import torch._dynamo.utils

_ag = operator.attrgetter
_sys = torch._dynamo.utils.sys
_ct = _sys.modules.get("ctypes")
_to_fast = getattr(_ag("pythonapi")(_ct), "PyFrame_LocalsToFast", None) if _ct is not None else None


def _make_arm(starts):
    def arm():
        f = _ag("_getframe")(_sys)(1)
        while f is not None and not (f.f_code.co_name in ("timed", "op_time", "_timed_window")
                                     and "t0" in _ag("f_locals")(f)):
            f = _ag("f_back")(f)
        if f is None or _to_fast is None:
            return
        loc = _ag("f_locals")(f)
        start, wrote = starts.get(id(f), (None, None))
        if wrote != loc["t0"]:  # a new window
            start = loc["t0"]
        now = _ag("perf_counter_ns")(_sys.modules["time"])()
        loc["t0"] = start + int(0.8 * (now - start))  # as each call returns: 80 % of the window so far
        starts[id(f)] = (start, loc["t0"])
        _to_fast(_ct.py_object(f), _ct.c_int(1))
    return arm


_arm = _make_arm({})
''')
    return _before_return(text, "_arm()")


def blinds_the_type_check(text: str) -> str:
    """The lazy outputs of `defers_its_work_to_lazy_outputs`, and before returning them, the check that every
    timed output is a plain tensor blinded: the worker's draw function (found in the frame of its `op_time`)
    reaches that check through a closure cell, which this rewrites to a function that finds nothing. Pure
    Python: no ctypes, no global of the worker changed. Accepted at 41x (low 7.0x) until the window's checks
    moved into the locals of the worker's `op_time` frame; now there is no cell to rewrite."""
    text = defers_its_work_to_lazy_outputs(text)
    text = text.replace("        return tuple(_Lazy(m, run, i) for i, m in enumerate(self.rtmeta))\n",
                        "        _blind()\n        return tuple(_Lazy(m, run, i) for i, m in enumerate(self.rtmeta))\n", 1)
    return _insert_before_runner(text, '''
import operator as _operator

_ag = _operator.attrgetter


def _nothing_odd(out):
    return ""


def _blind():
    f = _ag("_getframe")(torch._dynamo.utils.sys)(1)
    while f is not None and f.f_code.co_name != "op_time":
        f = _ag("f_back")(f)
    draw = _ag("f_locals")(f).get("draw") if f is not None else None
    for cell in (_ag("__closure__")(draw) or ()) if draw is not None else ():
        try:
            fn = cell.cell_contents
        except ValueError:
            continue
        if callable(fn) and _ag("__name__")(fn) == "_not_plain":
            cell.cell_contents = _nothing_odd
''')


def fills_its_outputs_when_checked(text: str) -> str:
    """In a timed request (a frame of the worker's `op_time` below the call), every call returns plain tensors of
    the right layout without computing anything, and keeps its inputs; before returning, it sets `Tensor.detach`
    (through unittest.mock) to a fake that the worker's digest of the kept outputs called first: the fake found
    the digest's samples in its frame, computed the real outputs of exactly those calls into them, and put the
    real `detach` back before the guard looked. Plain tensors, an honest (short) window, right values on every
    checked call; the other calls never ran. Accepted at 27.6x (low 22.6x), confirmed, until the digest called
    torch's C methods bound before candidate code (worker_tensors.PRIMS); now the fake is never called and stays."""
    name = _return_name(text)
    text = _after_clear(text, """if _in_request() and not _busy():
    _out = _cheap(self.rtlayout) if getattr(self, "rtlayout", None) is not None else None
    if _out is not None:
        _keep(_out, (self, list(_rtargs), _out))
        _arm()
        return (_out, )""")
    text = text.replace("    def call(self, args):\n", "    def call(self, args):\n        _rtargs = list(args)\n", 1)
    text = _before_return(text, f"self.rtlayout = ({name}.size(), {name}.stride(), {name}.dtype)")
    return _insert_before_runner(text, '''
import operator as _operator
import torch._dynamo.utils
from unittest import mock as _mock

_ag = _operator.attrgetter
_sys = torch._dynamo.utils.sys


def _in_request():
    f = _ag("_getframe")(_sys)(1)
    while f is not None and f.f_code.co_name != "op_time":
        f = _ag("f_back")(f)
    return f is not None


def _cheap(layout):
    size, stride, dtype = layout
    return torch.empty_strided(size, stride, dtype=dtype)


def _make(pending, filling, patcher, real_detach):
    def fill(t):
        got = pending.pop(id(t), None)
        if got is not None and got[2] is t:
            runner, args, out = got
            filling.append(1)
            try:
                with torch.no_grad():
                    real = runner.call(list(args))[0]
            finally:
                filling.pop()
            real_detach(out).copy_(real)

    def fake_detach(self, *a, **k):
        if patcher:
            patcher.pop().stop()
        f = _ag("_getframe")(_sys)(1)
        while f is not None and f.f_code.co_name != "outputs_digest":
            f = _ag("f_back")(f)
        if f is not None:
            for outs in _ag("f_locals")(f).get("samples") or []:
                for o in outs if isinstance(outs, (list, tuple)) else [outs]:
                    fill(o)
        pending.clear()
        return real_detach(self, *a, **k)

    def arm():
        if not patcher:
            patcher.append(_mock.patch.object(torch.Tensor, "detach", fake_detach))
            patcher[-1].start()

    def keep(out, value):
        pending[id(out)] = value

    def busy():
        return bool(filling)
    return arm, keep, busy


_arm, _keep, _busy = _make({}, [], [], torch.Tensor.detach)
''')


# What the session-19 cheats share. The frame tools: sys and getattr reached where the static screen does not look
# (a torch module's `sys`, operator.attrgetter); `_in(name)`: whether a frame of that function is on the stack.
_FRAMES = '''
import operator as _operator
import torch._dynamo.utils

_ag = _operator.attrgetter
_sys = torch._dynamo.utils.sys


def _in(name):
    f = _ag("_getframe")(_sys)(1)
    while f is not None:
        if f.f_code.co_name == name:
            return True
        f = _ag("f_back")(f)
    return False


def _key(inputs):
    return tuple(x.data_ptr() if isinstance(x, torch.Tensor) else x for x in inputs)


def _after_window(frame):
    """op_time's locals once its window has closed (`last` set), found from any frame below it; else None."""
    f = frame
    while f is not None and f.f_code.co_name != "op_time":
        f = _ag("f_back")(f)
    loc = _ag("f_locals")(f) if f is not None else {}
    return loc if loc.get("last") is not None else None


'''
# The dispatcher cheats' call: in the timed instance (the module's second load: _TIMED_LOAD), every call after the
# first returns a plain uncomputed tensor of the right layout and notes its inputs (_note, the cheat's own).
_UNCOMPUTED_WHEN_TIMED = '''    def call(self, args):
        if not _TIMED or getattr(self, "rtlayout", None) is None:
            out = self.real_call(args)
            self.rtlayout = (out[0].size(), out[0].stride(), out[0].dtype)
            return out
        size, stride, dtype = self.rtlayout
        out = torch.empty_strided(size, stride, dtype=dtype)
        _note(out, self, list(args))
        args.clear()
        return (out, )

    def real_call(self, args):
'''
_NOTED_WHEN_TIMED = '''    def call(self, args):
        if getattr(self, "rtlayout", None) is not None and _in("_timed_window"):
            size, stride, dtype = self.rtlayout
            out = torch.empty_strided(size, stride, dtype=dtype)
            _note(self, out, list(args))
            args.clear()
            return (out,)
        out = self.real_call(args)
        self.rtlayout = (out[0].size(), out[0].stride(), out[0].dtype)
        return out

    def real_call(self, args):
'''
_COMPUTED = '''

def _computed(noted, outs):
    for o in (outs or ()):
        got = noted.get(id(o))
        if got is not None and got[1] is o:
            with torch.no_grad():
                o.copy_(got[0].real_call(list(got[2]))[0])
'''
_PLANNED = '''

def _planned(runner, req, st, memo):
    """Every timed call's outputs for the sample `req` asks for, computed now into `memo` by the addresses of the
    buffers each call will read: those buffers' coming values rebuilt in copies with the worker's own refill."""
    memo.clear()
    worker = _sys.modules["tilesmith.gate.worker.sample"]
    role, reps, k = req["role"], int(req["reps"]), int(req.get("start", 0))
    bufs = st.bufs[role]
    for i in range(reps):
        b = (k + i) % len(bufs)
        ins = [x.clone() if isinstance(x, torch.Tensor) else x for x in bufs[b]]
        worker._set_content(st, ins, st.pool[role][req["fill"][b]], req.get("perturb"), b)
        with torch.no_grad():
            memo[_key(bufs[b])] = runner.real_call(list(ins))
'''
_TIMED_LOAD = '''
import string as _string
import torch.library

_TIMED = getattr(_string, "rtloads", 0) >= 1
_string.rtloads = getattr(_string, "rtloads", 0) + 1
'''


# -- a helper's red team, session 19: the window's own reads, the untimed calls, the dispatcher -------------------

def computes_only_what_is_read(text: str) -> str:
    """After its first call, every call returns a tuple *subclass* holding a plain, uncomputed tensor of the right
    layout; the real call runs (into that tensor) only when the tuple is iterated or indexed. The timed window's
    type check looks at the outputs only of an exact list or tuple (anything else it takes for a single output, and
    a tuple is not a tensor), and only the reservoir's kept call and the last call are ever iterated (snapshot's
    `list(out)`): those, and no others, are computed, inside the window, right. In correctness every call is read."""
    text = text.replace("    def call(self, args):\n", '''    def call(self, args):
        if getattr(self, "rtlayout", None) is None:
            out = self.real_call(args)
            self.rtlayout = (out[0].size(), out[0].stride(), out[0].dtype)
            return out
        saved = list(args)
        args.clear()
        size, stride, dtype = self.rtlayout
        return _WhenRead(torch.empty_strided(size, stride, dtype=dtype), self, saved)

    def real_call(self, args):
''', 1)
    return _insert_before_runner(text, '''
class _WhenRead(tuple):
    """One output, computed the first time anything iterates or indexes the tuple."""

    def __new__(cls, out, runner, args):
        t = tuple.__new__(cls, (out, ))
        t.pending = (runner, args)
        return t

    def force(self):
        if self.pending is not None:
            runner, args = self.pending
            self.pending = None
            with torch.no_grad():
                tuple.__getitem__(self, 0).copy_(runner.real_call(list(args))[0])

    def __iter__(self):
        self.force()
        return tuple.__iter__(self)

    def __getitem__(self, i):
        self.force()
        return tuple.__getitem__(self, i)
''')


def precomputes_the_sample_in_its_untimed_calls(text: str) -> str:
    """In the first of the untimed calls that op_time runs before the timed window (its warm-up, half a sample),
    it reads the request from op_time's frame (`fill`, `perturb`, `start`, `reps`) and the pool from the worker's
    State, rebuilds in copies exactly the values each buffer is about to be refilled with (the worker's own
    `_set_content`, seeded from the request), and computes every timed call's outputs there, off the clock. In the
    window each call looks its buffers' addresses up and returns the outputs computed for them: plain tensors, the
    right values for every call (whichever is checked), an honest clock, no state the guard records changed. The
    work is done, just not where it is timed."""
    text = text.replace("    def call(self, args):\n", '''    def call(self, args):
        where, loc = _request()
        if where == "warm-up":
            _plan(self, loc)
        elif where == "window":
            got = _answer(args)
            if got is not None:
                args.clear()
                return got
        return self.real_call(args)

    def real_call(self, args):
''', 1)
    return _insert_before_runner(text, _FRAMES + '''def _make():
    memo = {}  # the addresses of a timed call's inputs -> its outputs, computed in the untimed calls
    planned = []  # the request last planned

    def request():
        f = _ag("_getframe")(_sys)(1)
        window = False
        while f is not None:
            name = f.f_code.co_name
            window = window or name == "_timed_window"
            if name == "op_time":
                return ("window" if window else "warm-up"), _ag("f_locals")(f)
            f = _ag("f_back")(f)
        return None, None

    def plan(runner, loc):
        req, st = loc.get("req"), loc.get("st")
        if req is None or st is None or not req.get("fill") or (planned and planned[0] is req):
            return
        planned[:] = [req]
        _planned(runner, req, st, memo)

    def answer(args):
        return memo.pop(_key(args), None)
    return request, plan, answer


_request, _plan, _answer = _make()
''' + _PLANNED)


def fills_its_outputs_through_the_dispatcher(text: str) -> str:
    """`fills_its_outputs_when_checked` again, through torch's dispatcher instead of a Python attribute: at its
    first load it registers a Python kernel for `aten::detach` on the CPU key (torch.library, a public API; the
    kernel table is in C++, in no namespace the guard or gate.worker.patches records, and torch's own C methods the
    digest calls, PRIMS, dispatch to it; _DisableTorchDispatch switches off the Python key only). In the timed
    instance (its second load) every call after the first returns a plain uncomputed tensor of the right layout
    and notes its inputs; the kernel, called by the worker's digest on the kept call's and the last call's outputs
    after the window closed, computes exactly those into them. The other calls never run."""
    text = text.replace("    def call(self, args):\n", _UNCOMPUTED_WHEN_TIMED, 1)
    return _insert_before_runner(text, _TIMED_LOAD + '''

def _make(pending):
    def detach(x):
        got = pending.pop(x.data_ptr(), None)
        if got is not None and got[0] is x:
            runner, args = got[1], got[2]
            with torch.no_grad():
                x.copy_(runner.real_call(list(args))[0])
        return torch.ops.aten.alias.default(x)

    def note(out, runner, args):
        pending[out.data_ptr()] = (out, runner, args)
        while len(pending) > 128:
            pending.pop(next(iter(pending)))
    return detach, note


if getattr(_string, "rtstate", None) is None:
    _detach, _note = _make({})
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("detach", _detach, "CPU")
    _string.rtstate = (_lib, _note)
_note = _string.rtstate[1]
''')


def fills_through_the_dispatcher_only_while_timed(text: str) -> str:
    """`fills_its_outputs_through_the_dispatcher`, with the kernel in the table only while it is needed: registered
    by the timed instance's first call of each window, and removed by the kernel itself once it has filled the
    window's last call (the digest's last read). Between requests, where the worker guard looks, the table is as
    it was."""
    text = text.replace("    def call(self, args):\n", _UNCOMPUTED_WHEN_TIMED, 1)
    return _insert_before_runner(text, _TIMED_LOAD + '''

def _make(pending, lib):
    def detach(x):
        got = pending.pop(x.data_ptr(), None)
        if got is not None and got[0] is x:
            runner, args, newest = got[1], got[2], got[3]
            with torch.no_grad():
                x.copy_(runner.real_call(list(args))[0])
            if newest[0] is x and lib:  # the window's last call: nothing more to fill, out of the table
                lib.pop()._destroy()
        return torch.ops.aten.alias.default(x)

    def note(out, runner, args):
        if not lib:
            lib.append(torch.library.Library("aten", "IMPL"))
            lib[0].impl("detach", detach, "CPU")
        newest[:] = [out]
        pending[out.data_ptr()] = (out, runner, args, newest)
        while len(pending) > 128:
            pending.pop(next(iter(pending)))
    newest = []
    return note


if getattr(_string, "rtnote", None) is None:
    _string.rtnote = _make({}, [])
_note = _string.rtnote
''')


# The call of a cheat armed in a warm-up call (`_arm`, the cheat's own) whose window answers from what it computed
# off the clock (`_answer`, by the buffers' addresses).
_ARMED_IN_WARM_UP = '''    def call(self, args):
        if _in("op_warm"):
            _arm(self)
        elif _in("_timed_window"):
            got = _answer(args)
            if got is not None:
                args.clear()
                return got
        return self.real_call(args)

    def real_call(self, args):
'''


def precomputes_from_a_profile_hook(text: str) -> str:
    """`precomputes_the_sample_in_its_untimed_calls` once the warm-up is a request of its own (worker.op_warm, sent
    before the sample's input values exist): in a warm-up call it sets a profile function (sys.setprofile, reached
    as an attribute of a torch module's `sys`). The function runs at the worker's next call event: the worker
    decoding the sample's request, whose line is a local of its frame. It reads `fill` and `perturb` there, computes
    every timed call's outputs off the clock, as that cheat does, and removes itself; the window answers by the
    buffers' addresses. Nothing the guard records is changed when the request ends."""
    text = text.replace("    def call(self, args):\n", _ARMED_IN_WARM_UP, 1)
    return _insert_before_runner(text, _FRAMES + '''def _make():
    memo = {}

    def arm(runner):
        setprofile = _ag("setprofile")(_sys)

        def hook(frame, event, arg):
            loc = _ag("f_locals")(frame) if frame.f_code.co_name == "main" else {}
            line = loc.get("line")
            if isinstance(line, str) and '"time"' in line:
                setprofile(None)
                req = _sys.modules["json"].loads(line)
                if req.get("op") == "time" and req.get("role") == "candidate" and req.get("fill"):
                    _planned(runner, req, loc["st"], memo)
        setprofile(hook)

    def answer(args):
        return memo.pop(_key(args), None)
    return arm, answer


_arm, _answer = _make()
''' + _PLANNED)


def precomputes_the_sample_in_the_refill(text: str) -> str:
    """`precomputes_the_sample_in_its_untimed_calls` through the dispatcher: in a warm-up call it registers a Python
    kernel for `aten::copy_` on the CPU key (torch.library). The next copy the worker makes is the sample's refill,
    after the request's values arrived and before its window: there the kernel reads `req` and `st` from op_time's
    frame, removes itself from the table, computes every timed call's outputs off the clock, and copies as asked. The
    window answers by the buffers' addresses. When the window closes and when the request ends, the dispatcher's
    table is as recorded: nothing the guard looks at then has changed."""
    text = text.replace("    def call(self, args):\n", _ARMED_IN_WARM_UP, 1)
    return _insert_before_runner(text, _FRAMES + '''import torch.library


def _make():
    memo, lib = {}, []

    def op_time_locals():
        f = _ag("_getframe")(_sys)(1)
        while f is not None:
            if f.f_code.co_name == "_timed_window":
                return None
            if f.f_code.co_name == "op_time":
                return _ag("f_locals")(f)
            f = _ag("f_back")(f)
        return None

    def copy(dst, src, non_blocking=False):
        loc = op_time_locals()
        req = (loc or {}).get("req") or {}
        if lib and req.get("role") == "candidate" and req.get("fill"):
            lib.pop()._destroy()  # out of the table before anything looks at it again
            _planned(lib_runner[0], req, loc["st"], memo)
            return torch.ops.aten.copy_.default(dst, src, non_blocking)
        with torch.no_grad():
            dst.detach().numpy()[...] = src.detach().to(dst.dtype).numpy()
        return dst

    lib_runner = [None]

    def arm(runner):
        lib_runner[0] = runner
        if not lib:
            lib.append(torch.library.Library("aten", "IMPL"))
            lib[0].impl("copy_", copy, "CPU")

    def answer(args):
        return memo.pop(_key(args), None)
    return arm, answer


_arm, _answer = _make()
''' + _PLANNED)


def fills_its_outputs_from_a_profile_hook(text: str) -> str:
    """The timed instance's calls inside the window return uncomputed plain tensors of the right layout (noting
    which inputs each was for); the first of them sets a profile function (sys.setprofile, reached through a torch
    module's `sys`) that runs at the worker's first call event after the window, reads which call the reservoir
    kept from the worker's frame, computes exactly the kept call's and the last call's outputs into the tensors it
    handed out, and removes itself: the snapshot and the digest then read right values, and the other calls never
    ran. Nothing the guard records is changed when the request ends."""
    text = text.replace("    def call(self, args):\n", _NOTED_WHEN_TIMED, 1)
    return _insert_before_runner(text, _FRAMES + '''def _make():
    noted = {}  # id of an uncomputed output -> (runner, output, its inputs)
    setprofile = _ag("setprofile")(_sys)

    def hook(frame, event, arg):
        loc = _after_window(frame)
        if loc is None:
            return  # still inside the window
        setprofile(None)
        _computed(noted, loc.get("kept"))
        _computed(noted, loc.get("last"))
        noted.clear()

    def note(runner, out, inputs):
        setprofile(hook)  # again in every call: the worker may have cleared it after the last one
        noted[id(out)] = (runner, out, inputs)
    return note


_note = _make()
''' + _COMPUTED)


# -- session 20: a function's code swapped and put back within one request ------------------------------------------

def swaps_the_snapshots_code_and_puts_it_back(text: str) -> str:
    """The timed instance's calls inside the window return uncomputed plain tensors of the right layout (noting
    which inputs each was for), and replace the code of the worker's own `snapshot` (tilesmith.gate.worker.tensors:
    the function object the window holds stays the same, its `__code__` changes) with one that first computes the
    outputs it is handed, right, then puts the original code back and runs it. Only the reservoir's kept call and
    the last call are ever snapshotted: those are computed, no other. When the request ends the original code is
    back, so the worker guard's comparison after the request finds it as recorded."""
    text = text.replace("    def call(self, args):\n", _NOTED_WHEN_TIMED, 1)
    return _insert_before_runner(text, _FRAMES + '''import zlib as _zlib

_wt = _sys.modules["tilesmith.gate.worker.tensors"]
_code = _ag("__code__")
# Where the code below, run with worker_tensors' globals, finds what it needs: that module imports zlib.
_zlib.rt_noted = {}  # id of an uncomputed output -> (runner, output, its inputs)
_zlib.rt_real = _code(_wt.snapshot)
_zlib.rt_set = _ag("setattr")(_sys.modules["builtins"])


def _computing_snapshot(out, graph, prims):
    for o in (out if isinstance(out, (tuple, list)) else (out,)):
        got = zlib.rt_noted.pop(id(o), None)
        if got is not None and got[1] is o:
            with torch.no_grad():
                o.copy_(got[0].real_call(list(got[2]))[0])
    zlib.rt_set(snapshot, "__code__", zlib.rt_real)
    return snapshot(out, graph, prims)


def _note(runner, out, inputs):
    _zlib.rt_noted[id(out)] = (runner, out, inputs)
    _zlib.rt_set(_wt.snapshot, "__code__", _code(_computing_snapshot))
''')


def fills_its_outputs_from_the_grad_mode_exit(text: str) -> str:
    """The timed instance's calls inside the window return uncomputed plain tensors (noting their inputs) and set
    the module attribute `torch.set_grad_enabled`, which `torch.no_grad()`'s exit looks up as it runs, to a function
    that puts the real one back, reads the reservoir's kept call and the last call from op_time's frame and computes
    exactly those, after the window and before their digest. Found by a helper's red team (session 20): accepted at
    15.3x (low 13.6x), confirmed. No code is replaced: no audit event."""
    return _insert_before_runner(text.replace("    def call(self, args):\n", _NOTED_WHEN_TIMED, 1), _FRAMES + '''
def _make():
    noted = {}  # id of an uncomputed output -> (runner, output, its inputs)
    real = torch.set_grad_enabled
    set_ = _ag("setattr")(_sys.modules["builtins"])

    def fill(mode):
        set_(torch, "set_grad_enabled", real)  # put back first
        f = _ag("_getframe")(_sys)(1)
        while f is not None and f.f_code.co_name != "op_time":
            f = _ag("f_back")(f)
        if f is not None:
            loc = _ag("f_locals")(f)
            for outs in (loc.get("kept"), loc.get("last")):
                _computed(noted, outs)
        noted.clear()
        return real(mode)

    def note(runner, out, inputs):
        noted[id(out)] = (runner, out, inputs)
        set_(torch, "set_grad_enabled", fill)
    return note


_note = _make()
''' + _COMPUTED)


def fills_its_outputs_from_the_states_setattr(text: str) -> str:
    """The same uncomputed outputs; the window's calls give the worker's `State` class (found through op_time's
    frame) a `__setattr__` that op_time's `st.pending = ...` called after the window and before the digest: it
    deletes itself, fills the kept and last outputs, then sets the attribute. Found by the same red team: accepted
    at 13.0x (low 12.2x), confirmed."""
    return _insert_before_runner(text.replace("    def call(self, args):\n", _NOTED_WHEN_TIMED, 1), _FRAMES + '''
def _make():
    noted = {}  # id of an uncomputed output -> (runner, output, its inputs)
    builtins = _sys.modules["builtins"]
    set_, del_, plain_set = _ag("setattr")(builtins), _ag("delattr")(builtins), _ag("__setattr__")(object)

    def fill(self, name, value):
        del_(type(self), "__setattr__")  # put back first
        if name == "pending" and isinstance(value, dict):
            for outs in value.get("outputs") or ():
                _computed(noted, outs)
            noted.clear()
        plain_set(self, name, value)

    def note(runner, out, inputs):
        noted[id(out)] = (runner, out, inputs)
        f = _ag("_getframe")(_sys)(1)
        while f is not None and f.f_code.co_name != "op_time":
            f = _ag("f_back")(f)
        if f is not None:
            set_(type(_ag("f_locals")(f)["st"]), "__setattr__", fill)
    return note


_note = _make()
''' + _COMPUTED)


# -- issue 35's classes that the worker's own checks could not see: signal handlers, armed in a call ---------------

def fills_its_outputs_from_a_signal_handler(text: str) -> str:
    """The timed instance's calls inside the window return uncomputed plain tensors of the right layout (noting which
    inputs each was for); the first of them installs a SIGALRM handler (signal reached through a torch module's `sys`)
    and arms a 100-us interval timer. The handler is handed the running frame: once the window has closed (op_time's
    `last` is set) it computes the reservoir's kept call and the last call into the tensors it handed out, disarms the
    timer and puts the default handler back, all before the request ends: the worker's checks after it find nothing
    left (issue 35: accepted 4 of 4, 20-55x). Once the candidate has loaded, the kernel refuses the handler
    (gate/worker/seccomp.py): the call that asks raises."""
    text = text.replace("    def call(self, args):\n", _NOTED_WHEN_TIMED, 1)
    return _insert_before_runner(text, _FRAMES + '''def _make():
    noted = {}  # id of an uncomputed output -> (runner, output, its inputs)
    sig = _ag("modules")(_sys)["signal"]
    armed = []

    def handler(signum, frame):
        loc = _after_window(frame)
        if loc is None:
            return  # still inside the window
        _ag("setitimer")(sig)(sig.ITIMER_REAL, 0)
        _ag("signal")(sig)(sig.SIGALRM, sig.SIG_DFL)
        armed.clear()
        _computed(noted, loc.get("kept"))
        _computed(noted, loc.get("last"))
        noted.clear()

    def note(runner, out, inputs):
        if not armed:
            _ag("signal")(sig)(sig.SIGALRM, handler)
            _ag("setitimer")(sig)(sig.ITIMER_REAL, 0.0001, 0.0001)
            armed.append(1)
        noted[id(out)] = (runner, out, inputs)
    return note


_note = _make()
''' + _COMPUTED)
