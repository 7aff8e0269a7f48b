"""Red-team cheats against the stopped-worker read (gate/freeze.py) and the parked main thread
(tests/test_gate_redteam_freeze.py).

Written against branch `freeze` (1a4d71f): on the CPU the parent stops the worker after the closing mark and reads the
kept call's and the last call's outputs itself, the sample ending at that stop; the worker's main thread never runs
bytecode. Neither is beaten head-on; both cheats go around them:
- the reservoir's draw is the worker's own `os.urandom`, and a builtin's C entry point lives in writable memory: the
  draws rigged to zero make the kept call always the last, so only the last call of a sample needs its outputs;
- the span from the sample's request to its opening mark is not timed, and a native thread can take the GIL from
  the serving thread there (it gives it up in every torch op of the refill) and compute that last call off the clock.
Written for the dynamic defences: the static stage is off in their tests (`screen_off`); it refuses both (the
screen's module-state finding, and the allowlist).
"""

from __future__ import annotations

from tests.redteam import _COMPUTED, _FRAMES, _insert_before_runner  # noqa: F401  (_COMPUTED: the templates' fallback)

# The first try, alone not accepted (4 runs: 1.12x low 1.02x at 3 calls a sample, else 1 call a sample, where the only
# call is the last): in the timed window (a frame of the worker's `_timed_window` below the call), after real calls
# have recorded the output's layout, every call but the window's last returns a plain, uncomputed tensor of that layout and notes its
# inputs (`_note`); the last one (`i == len(calls) - 1`, read from the window's frame) first computes the call the
# reservoir keeps so far (`kept`, the same tensor objects: snapshot is `list(out)` on the CPU) into the tensors it
# handed out, then runs for real. Elsewhere (load, correctness, warm-up) it runs the original.
_ONLY_THE_KEPT_WHEN_TIMED = '''    def call(self, args):
        loc = _window_locals() if getattr(self, "rtlayout", None) is not None else None
        if loc is not None:
            if loc.get("i") != len(loc.get("calls") or ()) - 1:
                size, stride, dtype = self.rtlayout
                out = torch.empty_strided(size, stride, dtype=dtype)
                _noted[id(out)] = (self, out, list(args))
                args.clear()
                return (out,)
            _computed(_noted, loc.get("kept"))  # the reservoir's choice among the calls before this one
            _noted.clear()
        out = self.real_call(args)
        self.rtlayout = (out[0].size(), out[0].stride(), out[0].dtype)
        return out

    def real_call(self, args):
'''

_WINDOW_LOCALS = '''
_noted = {}  # id of an uncomputed output -> (runner, output, its inputs)


def _window_locals():
    """The worker's `_timed_window` locals (a snapshot: the call index `i`, `calls`, the reservoir's `kept`), or None
    outside a timed window."""
    f = _ag("_getframe")(_sys)(2)
    while f is not None and f.f_code.co_name != "_timed_window":
        f = _ag("f_back")(f)
    return _ag("f_locals")(f) if f is not None else None
'''


# os.urandom's method entry (the PyMethodDef in posixmodule's static table, writable data) rewritten to point at a
# ctypes callback: every holder of the builtin, the worker's `_urandom` bound at import and its window's `tools`
# included, calls it through `m_ml->ml_meth` at each call, and the object itself stays the same one. Inside a timed
# window it answers zeros; elsewhere it calls the original C function.
_ZERO_DRAWS = '''
def _zero_draws():
    ct = _ag("modules")(_sys)["ctypes"]
    urandom = _ag("urandom")(_ag("modules")(_sys)["os"])
    m_ml = ct.c_void_p.from_address(id(urandom) + 16).value  # PyCFunctionObject.m_ml (3.11: after the header)
    meth = ct.c_void_p.from_address(m_ml + 8)  # PyMethodDef.ml_meth
    if ct.c_char_p.from_address(m_ml).value != b"urandom" or ct.c_int.from_address(m_ml + 16).value != 0x8:  # METH_O
        return None
    proto = (ct.py_object, ct.py_object, ct.py_object)
    orig = _ag("PYFUNCTYPE")(ct)(*proto)(meth.value)

    def draw(module, n):
        if _in("_timed_window"):
            return bytes(n)  # 0 * (i + 1) < 65536: every call replaces the kept one, the last one is kept
        return orig(module, n)

    cb = _ag("CFUNCTYPE")(ct)(*proto)(draw)
    meth.value = ct.cast(cb, ct.c_void_p).value
    return cb


_string = _ag("modules")(_sys)["string"]
if getattr(_string, "rt_draws", None) is None:
    _string.rt_draws = [_zero_draws()]
_DRAWS_ZERO = _string.rt_draws[0] is not None
'''

# The calls of `_ONLY_THE_KEPT_WHEN_TIMED` with the draws rigged: the last call is the kept one, and the only one run.
_ONLY_THE_LAST_WHEN_TIMED = _ONLY_THE_KEPT_WHEN_TIMED.replace(
    "            _computed(_noted, loc.get(\"kept\"))  # the reservoir's choice among the calls before this one\n",
    "            if not _DRAWS_ZERO:\n                _computed(_noted, loc.get(\"kept\"))\n", 1)


def rigs_the_reservoirs_draws(text: str) -> str:
    """The reservoir's draw is `int.from_bytes(os.urandom(2)) * (i + 1) < 65536`, by the builtin bound at the worker's
    import. The builtin's PyMethodDef (libpython's writable data, reached through torch's ctypes from the builtin's
    own `m_ml`) gets a new `ml_meth`: a ctypes callback that answers zeros inside a timed window, so every call
    replaces the kept one and the kept call always is the last. No object changes identity, no attribute is set, no
    audit event is raised. Every timed call but the last returns a plain uncomputed tensor; the last runs: one call's
    work per sample, all inside the window."""
    text = text.replace("    def call(self, args):\n", _ONLY_THE_LAST_WHEN_TIMED, 1)
    return _insert_before_runner(text, _FRAMES + _WINDOW_LOCALS + _COMPUTED + _ZERO_DRAWS)


# -- before the window: a native thread that takes the GIL while the refill runs ------------------------------------

# A pthread (gcc at import, loaded with torch's ctypes) that sleeps on a semaphore until a warm-up call arms it, then
# calls a Python callback (ctypes takes the GIL for each call, and gives it back, and its thread state, after) until
# the callback says it is done. It runs no Python between calls: no thread the worker's checks count.
_POLL_C = r"""
#include <pthread.h>
#include <semaphore.h>
#include <unistd.h>
typedef int (*poll_fn)(void);
static sem_t sem;
static poll_fn poll_cb;
static volatile int armed;

static void *loop(void *arg) {
    (void)arg;
    for (;;) {
        sem_wait(&sem);
        while (poll_cb() == 0) usleep(30);  /* lets the serving thread take the GIL back */
        armed = 0;
    }
    return 0;
}

int rt_start(poll_fn f) {
    pthread_t t;
    poll_cb = f;
    if (sem_init(&sem, 0, 0)) return -1;
    if (pthread_create(&t, 0, loop, 0)) return -1;
    pthread_detach(t);
    return 0;
}

void rt_arm(void) {
    if (!armed) { armed = 1; sem_post(&sem); }
}
"""

_POLL_PY = '''
import subprocess as _subprocess
import tempfile as _tempfile

_POLL_C = {source!r}


def _poller():
    ct = _ag("modules")(_sys)["ctypes"]
    d = _tempfile.mkdtemp(prefix="rt-")
    with open(d + "/p.c", "w") as f:
        f.write(_POLL_C)
    _subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-pthread", d + "/p.c", "-o", d + "/p.so"], check=True,
                    capture_output=True)
    lib = _ag("CDLL")(ct)(d + "/p.so")
    clock = _ag("monotonic")(_ag("modules")(_sys)["time"])
    get_ident = _ag("get_ident")(_ag("modules")(_sys)["_thread"])
    frames_of = _ag("_current_frames")(_sys)
    memo, plan = {{}}, {{"runner": None, "tid": None, "since": 0.0}}

    switch = _ag("setswitchinterval")(_sys), _ag("getswitchinterval")(_sys)()

    def done():
        switch[0](switch[1])
        return 1

    def poll():
        # Called holding the GIL, which the serving thread gave up for a moment (a torch op of the refill, a
        # system call): where is it? 1 = done (or too late), 0 = ask again.
        try:
            if clock() - plan["since"] > 0.25:
                return done()
            f = frames_of().get(plan["tid"])
            names, fr = {{}}, f
            while fr is not None:
                names.setdefault(fr.f_code.co_name, fr)
                fr = _ag("f_back")(fr)
            if "op_time" not in names:
                return 0
            if "_timed_window" in names and ("t0" in _ag("f_locals")(names["_timed_window"])
                                             or f.f_code.co_name != "_same_file"):
                return done()  # the opening mark is sent (or being sent): too late
            loc = _ag("f_locals")(names["op_time"])
            req, st = loc.get("req") or {{}}, loc.get("st")
            if req.get("role") != "candidate" or st is None:
                return 0
            bufs = st.bufs["candidate"]
            s = (int(req.get("start", 0)) + int(req["reps"]) - 1) % len(bufs)  # the last call's set: the kept one
            if "_set_content" in names:
                if _ag("f_locals")(names["_set_content"]).get("b", -1) <= s:
                    return 0  # its values are not all in yet
            elif "window" not in loc:
                return 0  # the refill has not started
            key = _key(bufs[s])
            with torch.no_grad():
                memo[key] = plan["runner"].held_call(list(bufs[s]))
            return done()
        except Exception:
            return done()

    cb = _ag("CFUNCTYPE")(ct)(ct.c_int)(poll)
    if lib.rt_start(cb) != 0:
        return None

    def arm(runner):
        plan["runner"], plan["tid"], plan["since"] = runner, get_ident(), clock()
        memo.clear()
        # While armed, a thread waiting for the GIL asks its holder to give it up only after a second, not 5 ms:
        # neither the serving thread (waiting through the callback's compute) nor the callback (through the
        # serving thread's bytecode) is cut off midway. Put back by the callback, and by the window's last call.
        switch[0](1.0)
        lib.rt_arm()

    return arm, memo, cb, lib, done


if getattr(_string, "rt_poller", None) is None:
    _string.rt_poller = [_poller()]
_arm, _memo, _, _, _done = _string.rt_poller[0] if _string.rt_poller[0] else (None, {{}}, 0, 0, lambda: 1)
'''

# Warm-up calls arm the poller; in the window every call but the last returns an uncomputed tensor, and the last
# answers from the poller's memo, by its inputs' addresses, or runs.
_PRECOMPUTED_LAST_WHEN_TIMED = '''    def call(self, args):
        if _arm is not None and _in("op_warm"):
            _arm(self)
        loc = _window_locals() if getattr(self, "rtlayout", None) is not None else None
        if loc is not None:
            if loc.get("i") != len(loc.get("calls") or ()) - 1:
                size, stride, dtype = self.rtlayout
                args.clear()
                return (torch.empty_strided(size, stride, dtype=dtype),)
            _done()
            got = _memo.pop(_key(args), None)
            if got is not None:
                args.clear()
                return got
        out = self.real_call(args)
        self.rtlayout = (out[0].size(), out[0].stride(), out[0].dtype)
        return out

    def real_call(self, args):
'''


def precomputes_the_kept_call_while_the_refill_runs(text: str) -> str:
    """`rigs_the_reservoirs_draws` (the kept call is the last), and the last call's outputs computed before the window
    opens: a warm-up call arms a native pthread that calls a Python callback each time it gets the GIL, which the
    serving thread gives up inside every torch op of the sample's refill. The callback reads the serving thread's
    frames (sys._current_frames: op_time's `req` says which buffer set the last call reads, _set_content's `b` how far
    the refill has come) and, once that set holds its new values, runs the call on it off the clock, keeping the GIL
    all along (a copy of Runner.call whose addmm is MKL's SGEMM through a PYFUNCTYPE prototype; the switch interval
    raised to 1 s while armed, so the waiting serving thread does not ask for it back). In the window no call computes
    anything; the last answers from the memo (or runs, where the refill gave no chance). Tried 9 times while it was
    built: 3 rejected as process-state (the callback, cut off mid-compute by the serving thread's GIL request, was
    counted among thread states), 4 not faster (the poller starved the serving thread, or computed after the opening
    mark's send), then the 2 accepted runs."""
    text = _with_held_call(text)
    text = text.replace("    def call(self, args):\n", _PRECOMPUTED_LAST_WHEN_TIMED, 1)
    return _insert_before_runner(text, _FRAMES + _WINDOW_LOCALS + _COMPUTED + _ZERO_DRAWS + _HELD_ADDMM
                                 + _POLL_PY.format(source=_POLL_C))

# extern_kernels.addmm releases the GIL (a torch op): run holding it, through MKL's Fortran SGEMM in libtorch_cpu
# called with a PYFUNCTYPE prototype (ctypes keeps the GIL for those). Inductor's cpp_pybinding kernels keep it too.
_HELD_ADDMM = '''

def _sgemm():
    ct = _ag("modules")(_sys)["ctypes"]
    import os as _os
    lib = _ag("CDLL")(ct)(_os.path.join(_os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    p = ct.c_void_p
    return _ag("PYFUNCTYPE")(ct)(None, ct.c_char_p, ct.c_char_p, p, p, p, p, p, p, p, p, p, p, p)(("SGEMM", lib))


_SGEMM = _sgemm()
_ONES = torch.ones(1 << 16)


def _held_addmm(bias, x, w, alpha=1, beta=1, out=None):
    """out = bias + x @ w (row-major out), holding the GIL; out^T = w^T x^T in column-major terms."""
    ct = _ag("modules")(_sys)["ctypes"]
    M, K = x.shape
    N = w.shape[1]
    ref = lambda v: ct.byref(ct.c_int(v))
    fl = lambda v: ct.byref(ct.c_float(v))
    # C' (N x M, ldc N) = bias (N x 1) ones (1 x M)
    _SGEMM(b"N", b"N", ref(N), ref(M), ref(1), fl(1.0), bias.data_ptr(), ref(N), _ONES.data_ptr(), ref(1), fl(0.0),
           out.data_ptr(), ref(N))
    w0, w1 = w.stride()
    ta, lda = (b"N", w0) if w1 == 1 else (b"T", w1)
    x0, x1 = x.stride()
    tb, ldb = (b"N", x0) if x1 == 1 else (b"T", x1)
    _SGEMM(ta, tb, ref(N), ref(M), ref(K), fl(float(alpha)), w.data_ptr(), ref(lda), x.data_ptr(), ref(ldb),
           fl(float(beta)), out.data_ptr(), ref(N))
    return out
'''


def _with_held_call(text: str) -> str:
    """A copy of Runner.call, `held_call`, whose addmm keeps the GIL."""
    start = text.index("    def call(self, args):\n")
    end = text.index("\nrunner = Runner(")
    body = text[start:end].replace("    def call(self, args):\n", "    def held_call(self, args):\n", 1)
    body = body.replace("extern_kernels.addmm(", "_held_addmm(")
    return text[:end] + "\n" + body + text[end:]


# -- every call computed before the window, none inside it ------------------------------------------------------------

# The poller of `precomputes_the_kept_call_while_the_refill_runs`, computing every timed call's outputs: each call's
# buffer set as soon as the refill has moved past it (sets before _set_content's `b` hold their values), one set per
# time it holds the GIL, until every call of the sample is in the memo.
_PICK = _POLL_PY.index('            bufs = st.bufs["candidate"]\n')  # which set to compute, and computing it
_PICKED = _POLL_PY.index("            return done()\n", _PICK) + len("            return done()\n")
_POLL_EVERY_PY = _POLL_PY[:_PICK] + '''            bufs = st.bufs["candidate"]
            k0, reps = int(req.get("start", 0)), int(req["reps"])
            if "_set_content" in names:
                filled = _ag("f_locals")(names["_set_content"]).get("b", -1)  # the sets before it are refilled
            elif "window" in loc:
                filled = len(bufs)
            else:
                return 0  # the refill has not started
            for s in [(k0 + i) % len(bufs) for i in range(reps)]:
                key = _key(bufs[s])
                if s < filled and key not in memo:
                    with torch.no_grad():
                        memo[key] = plan["runner"].held_call(list(bufs[s]))
                    return done() if len(memo) >= reps else 0
            return 0
''' + _POLL_PY[_PICKED:]

_EVERY_FROM_THE_MEMO_WHEN_TIMED = '''    def call(self, args):
        if _arm is not None and _in("op_warm"):
            _arm(self)
        if _in("_timed_window"):
            _done()
            got = _memo.pop(_key(args), None)
            if got is not None:
                args.clear()
                return got
        return self.real_call(args)

    def real_call(self, args):
'''

_STRING = '''
_string = _ag("modules")(_sys)["string"]
'''


def precomputes_every_call_while_the_refill_runs(text: str) -> str:
    """The native poller of `precomputes_the_kept_call_while_the_refill_runs`, made for a parent that chooses the
    checked call itself after the stop: no draw is rigged, and every timed call's outputs are computed before the
    window opens, each on its buffer set once the refill has written that set's values (read from the serving
    thread's frames), holding the GIL the serving thread gives up inside the refill's torch ops. In the window each
    call answers from the memo by its inputs' addresses (or runs, where the refill gave no chance): whichever call
    the parent reads holds right values, computed off the clock."""
    text = _with_held_call(text)
    text = text.replace("    def call(self, args):\n", _EVERY_FROM_THE_MEMO_WHEN_TIMED, 1)
    return _insert_before_runner(text, _FRAMES + _STRING + _HELD_ADDMM + _POLL_EVERY_PY.format(source=_POLL_C))


# Children forked at the module's first import (before the worker's seccomp filter, which refuses a process started
# later): one serves every call from shared memory, the others spin while it works, so that every core is taken;
# the caller polls for the answer with sched_yield: runnable all along, it gives its core up to them, so its wait is
# the scheduler's run delay while the child does the call's whole work. (Pinning itself to the child's core and
# lowering its own priority did the same more surely: the worker's process-state check rejects both.)
_CHILD_SERVES = '''
import pickle as _pickle
import select as _select
import torch._dynamo.utils as _u

_os = _u.os
_SHM_BYTES = 1 << 25


def _view(off, size, stride, dtype):
    span = 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else 0
    item = torch.empty((), dtype=dtype).element_size()
    raw = _u.__dict__["_rt_child"]["shm"][off:off + max(span, 1) * item]
    return raw.view(dtype).as_strided(size, stride)


def _lay(tensors):
    metas, off = [], 0
    for t in tensors:
        metas.append((off, tuple(t.size()), tuple(t.stride()), t.dtype))
        span = 1 + sum((s - 1) * st for s, st in zip(t.size(), t.stride())) if all(t.size()) else 1
        off += -(-span * t.element_size() // 64) * 64
    return metas


def _read(fd):
    n = int.from_bytes(_os.read(fd, 8), "little")
    data = b""
    while len(data) < n:
        data += _os.read(fd, n - len(data))
    return _pickle.loads(data)


def _write(fd, obj):
    data = _pickle.dumps(obj)
    _os.write(fd, len(data).to_bytes(8, "little") + data)


def _serve(runner):
    shared = _u.__dict__["_rt_child"]
    while True:
        metas = _read(shared["req"][0])
        outs = runner.real_call([_view(*m) for m in metas])
        half = _SHM_BYTES // 2
        back = [(half + o, s, st, d) for o, s, st, d in _lay(outs)]
        for m, out in zip(back, outs):
            _view(*m).copy_(out)
        shared["flag"][0] = 0
        _write(shared["rep"][1], back)


def _spin(fd):
    flag = _u.__dict__["_rt_child"]["flag"]
    while True:
        _os.read(fd, 1)
        while int(flag[0]):
            pass


def _start_children(runner):
    if "_rt_child" in _u.__dict__:
        return
    shared = _u.__dict__["_rt_child"] = {"shm": torch.zeros(_SHM_BYTES, dtype=torch.uint8).share_memory_(),
                                         "flag": torch.zeros(1, dtype=torch.int64).share_memory_(),
                                         "req": _os.pipe(), "rep": _os.pipe(), "spin": []}
    if _os.fork() == 0:
        _serve(runner)
    for _ in range(len(_os.sched_getaffinity(0)) - 1):
        r, w = _os.pipe()
        shared["spin"].append(w)
        if _os.fork() == 0:
            _spin(r)


def _by_the_child(args):
    shared = _u.__dict__["_rt_child"]
    metas = _lay(args)
    for m, a in zip(metas, args):
        _view(*m).copy_(a)
    args.clear()
    shared["flag"][0] = 1
    for w in shared["spin"]:
        _os.write(w, b"g")
    _write(shared["req"][1], metas)
    while not _select.select([shared["rep"][0]], [], [], 0)[0]:
        _os.sched_yield()
    outs = []
    for off, size, stride, dtype in _read(shared["rep"][0]):
        o = torch.empty_strided(size, stride, dtype=dtype)
        o.copy_(_view(off, size, stride, dtype))
        outs.append(o)
    return tuple(outs)
'''


def hands_its_work_to_a_child_while_it_waits(text: str) -> str:
    """Every call's work done by a child process forked at import while the caller, yielding its core, waits in the
    run queue: the serving thread's wait is the scheduler's run delay, which the parent takes out of a filled sample
    where the machine's other work caused it (procfs.forgiven_ns). The children are in the worker's tree: they ran,
    and a wait is only taken out as long as every thread that ran waited, never below the tree's CPU time. (A child forked after the load is refused by the worker's seccomp filter;
    one that worked and was reaped within a sample would leave nothing to charge.)"""
    text = text.replace("    def call(self, args):\n", '''    def call(self, args):
        return _by_the_child(args)

    def real_call(self, args):
''', 1)
    text = _insert_before_runner(text, _CHILD_SERVES)
    assert "\nrunner = Runner(" in text
    return text + "\n_start_children(runner)\n"
