"""Red-team cheats that do a candidate's work outside its timed window (tests/test_gate_redteam_late.py).

Written against a gate that timed a sample by the kernel's timestamps of the worker's two marks and snapshotted and
digested the kept outputs afterwards, in the same process: whatever candidate code ran between the closing mark and
the digest's reads was off the clock, and once the window had closed it could know which two calls are checked
(what rejects each now: tests/test_gate_redteam_late.py):
- userfaultfd: the outputs' memory is filled by the first read of it (the digest), by a thread of the candidate's;
- Py_AddPendingCall: a callback the interpreter runs on the main thread between the worker's bytecodes, as it runs a
  signal handler, with no signal (also before the window: the same callback precomputes a sample at op_time's entry).
Written for the dynamic defences: the static stage is off in their tests (`screen_off`); the native one is refused
by the screen, the others only by the allowlist.
"""

from __future__ import annotations

from tests.redteam import _FRAMES, _insert_before_runner

# In the timed window (a frame of the worker's `_timed_window` below the call), after real calls have recorded the
# output's layout, a call returns `_lazy(...)`'s plain tensor of that layout instead of running; elsewhere (load,
# correctness, warm-up) it runs the original.
_LAZY_WHEN_TIMED = '''    def call(self, args):
        if getattr(self, "rtlayout", None) is not None and _in("_timed_window"):
            out = _lazy(self, list(args), self.rtlayout)
            if out is not None:
                args.clear()
                return (out, )
        out = self.real_call(args)
        self.rtlayout = (out[0].size(), out[0].stride(), out[0].dtype)
        return out

    def real_call(self, args):
'''

# The native part: a userfaultfd (UFFD_USER_MODE_ONLY, which needs no privilege even where
# vm.unprivileged_userfaultfd is 0, kernel >= 5.11) over one large reserved region, and a pthread that waits on it.
# The first read of a page of the region by any thread blocks that thread in the kernel; the pthread hands the
# fault's address to a Python callback (ctypes takes the GIL for it: the reader must have released it, as
# zlib.crc32 does for buffers over 5 KiB), which says what to copy in; UFFDIO_COPY fills the pages and wakes the
# reader. Pages no one reads are never computed. A callback that gives nothing gets a zero page: no reader hangs.
_UFFD_C = r"""
#define _GNU_SOURCE
#include <linux/userfaultfd.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/ioctl.h>
#include <pthread.h>
#include <poll.h>
#include <unistd.h>
#include <fcntl.h>
#include <errno.h>
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

typedef void (*fill_fn)(unsigned long addr, unsigned long *out);  /* out: dst, src, len */
static int ufd = -1;
static fill_fn fill;
static volatile long faults;

static void *serve(void *arg) {
    (void)arg;
    for (;;) {
        struct pollfd p = {ufd, POLLIN, 0};
        if (poll(&p, 1, -1) < 0) continue;
        struct uffd_msg m;
        if (read(ufd, &m, sizeof m) != sizeof m || m.event != UFFD_EVENT_PAGEFAULT) continue;
        faults++;
        unsigned long out[3] = {0, 0, 0}, page = m.arg.pagefault.address & ~4095UL;
        fill(m.arg.pagefault.address, out);
        if (out[1]) {
            struct uffdio_copy c = {.dst = out[0], .src = out[1], .len = out[2], .mode = 0};
            if (ioctl(ufd, UFFDIO_COPY, &c) == 0) continue;
        }
        struct uffdio_zeropage z = {.range = {page, 4096}, .mode = 0};
        if (ioctl(ufd, UFFDIO_ZEROPAGE, &z) != 0) {
            struct uffdio_range w = {page, 4096};
            ioctl(ufd, UFFDIO_WAKE, &w);
        }
    }
    return 0;
}

/* 0 on success; the uffd's flags otherwise tried without UFFD_USER_MODE_ONLY (a privileged process). */
int rt_start(fill_fn f) {
    fill = f;
    ufd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    if (ufd < 0) ufd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (ufd < 0) return -errno;
    struct uffdio_api api = {.api = UFFD_API, .features = 0};
    if (ioctl(ufd, UFFDIO_API, &api)) return -errno;
    pthread_t t;
    if (pthread_create(&t, 0, serve, 0)) return -1;
    pthread_detach(t);
    return 0;
}

unsigned long rt_region(unsigned long len) {
    void *r = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return 0;
    struct uffdio_register reg = {.range = {(unsigned long)r, len}, .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (ioctl(ufd, UFFDIO_REGISTER, &reg)) return 0;
    return (unsigned long)r;
}

/* Pages handed out before are missing again (their next read faults). */
int rt_rearm(unsigned long addr, unsigned long len) { return madvise((void *)addr, len, MADV_DONTNEED); }

long rt_faults(void) { return faults; }
"""

_UFFD_PY = '''
import ctypes as _ctypes
import string as _string
import subprocess as _subprocess
import tempfile as _tempfile

_UFFD_C = {source!r}


def _build():
    d = _tempfile.mkdtemp(prefix="rt-")
    with open(d + "/u.c", "w") as f:
        f.write(_UFFD_C)
    _subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-pthread", d + "/u.c", "-o", d + "/u.so"], check=True,
                    capture_output=True)
    return _ctypes.CDLL(d + "/u.so")


_FILL = _ctypes.CFUNCTYPE(None, _ctypes.c_ulong, _ctypes.POINTER(_ctypes.c_ulong))
_REGION_BYTES = 1 << 34  # address space only (MAP_NORESERVE): a page is backed once it is filled


def _make():
    """One per process (the module is loaded twice in a gate worker): the region, the fault server, the notes."""
    lib = _build()
    lib.rt_region.restype = _ctypes.c_ulong
    lib.rt_region.argtypes = [_ctypes.c_ulong]
    lib.rt_rearm.argtypes = [_ctypes.c_ulong, _ctypes.c_ulong]
    noted = {{}}  # slot address -> (runner, inputs, slot bytes)
    held = []  # the staging tensor being copied in (alive until the next fault)
    state = {{"next": 0}}

    def fill(addr, out):
        base = max((b for b in noted if b <= addr), default=None)
        got = noted.pop(base, None) if base is not None else None
        if got is None or addr >= base + got[2]:
            return
        runner, inputs, slot = got
        with torch.no_grad():
            real = runner.real_call(list(inputs))[0].contiguous()
        stage = torch.zeros(slot, dtype=torch.uint8)
        stage[:real.numel() * real.element_size()].copy_(real.view(-1).view(torch.uint8))
        held[:] = [stage]
        out[0], out[1], out[2] = base, stage.data_ptr(), slot

    cb = _FILL(fill)
    rc = lib.rt_start(cb)
    if rc != 0:
        return None
    region = lib.rt_region(_REGION_BYTES)

    def lazy(runner, inputs, layout):
        size, stride, dtype = layout
        numel = 1
        for s in size:
            numel *= s
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        slot = (nbytes + 4095) // 4096 * 4096
        if not region or not slot:
            return None
        if state["next"] + slot > _REGION_BYTES:  # wrapped: every slot is missing again
            lib.rt_rearm(region, _REGION_BYTES)
            noted.clear()
            state["next"] = 0
        base = region + state["next"]
        state["next"] += slot
        noted[base] = (runner, inputs, slot)
        if len(noted) > 4096:  # outputs nobody read: forgotten, never computed
            del noted[next(iter(noted))]
        buf = (_ctypes.c_char * nbytes).from_address(base)
        return torch.frombuffer(buf, dtype=dtype, count=numel).view(size)

    return lazy, cb, lib


if getattr(_string, "rt_uffd", None) is None:
    _string.rt_uffd = _make()
_lazy = _string.rt_uffd[0] if _string.rt_uffd else (lambda runner, inputs, layout: None)
'''


def computes_its_outputs_on_first_read(text: str) -> str:
    """In the timed window every call returns, without computing anything, a plain tensor of the right layout whose
    memory is a fresh slot of a region registered with userfaultfd (UFFD_USER_MODE_ONLY: no privilege needed), and
    notes which inputs it was for. A native pthread (gcc at import, loaded with ctypes) serves the region's page
    faults: the first read of a slot, which is the worker's digest of the reservoir's kept call and of the last call
    (zlib.crc32, after the window's closing mark, with the GIL released), blocks in the kernel while the thread
    runs the real call on the noted inputs (a ctypes callback into Python) and copies its bytes in. Only the outputs
    the gate reads are ever computed, and after the clock stopped; the others stay unbacked address space."""
    text = text.replace("    def call(self, args):\n", _LAZY_WHEN_TIMED, 1)
    return _insert_before_runner(text, _FRAMES + _UFFD_PY.format(source=_UFFD_C))



# The same, with no native code of its own: ctypes is already imported by torch (reached through sys.modules, no
# import), libc's syscall, ioctl, mmap and read through prototypes, and the fault server a raw Python thread started
# by the window's last call that ends once the outputs the digest reads are in (its thread state is gone before the
# worker's checks after the request count thread states).
_LAZY_WINDOW_PY = """
_ct = _ag("modules")(_sys)["ctypes"]
_u64 = _ct.c_uint64
_REGION_BYTES = 1 << 34  # address space only (MAP_NORESERVE): a page is backed once it is filled
_UFFDIO_API, _UFFDIO_REGISTER, _UFFDIO_COPY, _UFFDIO_ZEROPAGE = 0xC018AA3F, 0xC020AA00, 0xC028AA03, 0xC020AA04


def _make():
    libc = _ag("CDLL")(_ct)(None, use_errno=True)

    def fn(name, res, *args):
        return _ag("CFUNCTYPE")(_ct)(res, *args, use_errno=True)((name, libc))

    syscall = fn("syscall", _ct.c_long, _ct.c_long, _ct.c_long)
    ioctl = fn("ioctl", _ct.c_int, _ct.c_int, _ct.c_ulong, _ct.c_void_p)
    # The same call holding the GIL (a PYFUNCTYPE prototype): the reader it wakes finishes its read and then waits
    # for the GIL until this thread has ended.
    ioctl_held = _ag("PYFUNCTYPE")(_ct)(_ct.c_int, _ct.c_int, _ct.c_ulong, _ct.c_void_p)(("ioctl", libc))
    mmap = fn("mmap", _ct.c_void_p, _ct.c_void_p, _ct.c_size_t, _ct.c_int, _ct.c_int, _ct.c_int, _ct.c_long)
    read = fn("read", _ct.c_ssize_t, _ct.c_int, _ct.c_void_p, _ct.c_size_t)
    start = torch._dynamo.utils.threading._start_new_thread
    ufd = syscall(323, 0o2000000 | 1)  # userfaultfd(O_CLOEXEC | UFFD_USER_MODE_ONLY): blocking reads
    api = (_u64 * 3)(0xAA, 0, 0)
    if ufd < 0 or ioctl(ufd, _UFFDIO_API, _ct.addressof(api)) != 0:
        return None
    region = mmap(None, _REGION_BYTES, 3, 0x22 | 0x4000, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS|NORESERVE
    reg = (_u64 * 4)(region or 0, _REGION_BYTES, 1, 0)  # UFFDIO_REGISTER_MODE_MISSING
    if not region or ioctl(ufd, _UFFDIO_REGISTER, _ct.addressof(reg)) != 0:
        return None
    noted = {}  # slot address -> (runner, inputs, slot bytes)
    state = {"next": 0}

    held = []  # what the last copy read from, and the window's frame: freed by a later fault, never as a thread ends

    def staged(addr):
        # (slot address, source address, bytes) to copy in for a fault at addr, the real call run now; (page, 0,
        # 4096) where there is none: a zero page, so the reader never hangs.
        base = max((b for b in noted if b <= addr), default=None)
        got = noted.pop(base, None) if base is not None else None
        if got is None or addr >= base + got[2]:
            return addr // 4096 * 4096, 0, 4096
        runner, inputs, slot = got
        with torch.no_grad():
            real = runner.real_call(list(inputs))[0].contiguous()
        stage = torch.zeros(slot, dtype=torch.uint8)
        stage[:real.numel() * real.element_size()].copy_(real.view(-1).view(torch.uint8))
        held.append(stage)
        return base, stage.data_ptr(), slot

    def serve(frame):
        msg = (_u64 * 4)()
        want = None
        del held[:]
        held.append(frame)
        while True:
            if read(ufd, _ct.addressof(msg), 32) != 32 or msg[0] & 0xFF != 0x12:  # UFFD_EVENT_PAGEFAULT
                continue
            if want is None:  # the window has closed: the kept call's and the last call's slots are read
                loc = _ag("f_locals")(frame)
                want = {o.data_ptr() for outs in (loc.get("kept"), loc.get("last")) for o in (outs or ())}
            dst, src, n = staged(msg[2])
            want.discard(dst)
            done = not want
            # The copy wakes the reader; made holding the GIL, the last one is this thread's last act: the reader
            # runs Python again only once the thread is gone (nothing is freed after it).
            arg = (_u64 * 5)(dst, src, n, 0, 0) if src else (_u64 * 4)(dst, n, 0, 0)
            ioctl_held(ufd, _UFFDIO_COPY if src else _UFFDIO_ZEROPAGE, _ct.addressof(arg))
            if done:
                return

    def lazy(runner, inputs, layout, frame):
        size, stride, dtype = layout
        numel = 1
        for s in size:
            numel *= s
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        slot = (nbytes + 4095) // 4096 * 4096
        if not slot or state["next"] + slot > _REGION_BYTES:
            return None
        base = region + state["next"]
        state["next"] += slot
        noted[base] = (runner, inputs, slot)
        if len(noted) > 4096:  # outputs nobody read: forgotten, never computed
            del noted[next(iter(noted))]
        loc = _ag("f_locals")(frame)
        if loc.get("i") == len(loc.get("calls") or ()) - 1:  # the window's last call: its digest comes next
            start(serve, (frame, ))
        buf = _ag("from_address")(_ct.c_char * nbytes)(base)
        return torch.frombuffer(buf, dtype=dtype, count=numel).view(size)

    return lazy


def _window():
    f = _ag("_getframe")(_sys)(2)
    while f is not None and f.f_code.co_name != "_timed_window":
        f = _ag("f_back")(f)
    return f


_string = _ag("modules")(_sys)["string"]
if getattr(_string, "rt_uffd_py", None) is None:
    _string.rt_uffd_py = [_make()]
_lazy = _string.rt_uffd_py[0]
"""

_LAZY_WHEN_TIMED_PY = '''    def call(self, args):
        frame = _window() if getattr(self, "rtlayout", None) is not None and _lazy is not None else None
        if frame is not None:
            out = _lazy(self, list(args), self.rtlayout, frame)
            if out is not None:
                args.clear()
                return (out, )
        out = self.real_call(args)
        self.rtlayout = (out[0].size(), out[0].stride(), out[0].dtype)
        return out

    def real_call(self, args):
'''


def computes_its_outputs_on_first_read_from_python(text: str) -> str:
    """`computes_its_outputs_on_first_read` with no native code of its own and no import the screen knows: torch's
    own ctypes (from sys.modules) calls libc's userfaultfd, ioctl, mmap and read; the fault server is a raw Python
    thread (threading's low-level start function, reached through a torch module) that the window's last call starts,
    blocked in read() with the GIL released until the digest's first read of a kept output; it computes the kept
    call's and the last call's outputs, copies them in, and ends, before the request does."""
    text = text.replace("    def call(self, args):\n", _LAZY_WHEN_TIMED_PY, 1)
    return _insert_before_runner(text, _FRAMES + _LAZY_WINDOW_PY)


# -- the interpreter's pending calls: a signal handler's way into the worker's frames, with no signal ----------------

_PENDING_PY = '''def _make():
    ct = _ag("modules")(_sys)["ctypes"]
    pending = _ag("CFUNCTYPE")(ct)(ct.c_int, ct.c_void_p)
    add = _ag("PYFUNCTYPE")(ct)(ct.c_int, pending, ct.c_void_p)(("Py_AddPendingCall", _ag("pythonapi")(ct)))
    noted = {}  # id of an uncomputed output -> (runner, output, its inputs)
    armed = []  # the window's frame, while a pending call is queued

    def fill(_):
        if not armed:
            return 0
        loc = _ag("f_locals")(armed[0])
        if "t1" not in loc:  # the window is still open: queued again, for the interpreter's next check
            add(cb, None)
            return 0
        armed.clear()
        _computed(noted, loc.get("kept"))
        _computed(noted, loc.get("last"))
        noted.clear()
        return 0

    cb = pending(fill)

    def note(runner, out, inputs):
        noted[id(out)] = (runner, out, inputs)
        f = _ag("_getframe")(_sys)(2)
        while f is not None and f.f_code.co_name != "_timed_window":
            f = _ag("f_back")(f)
        loc = _ag("f_locals")(f) if f is not None else {}
        if not armed and loc.get("i") == len(loc.get("calls") or ()) - 1:  # the window's last call
            armed.append(f)
            add(cb, None)
    return note, cb


_note, _keep_alive = _make()
'''


def fills_its_outputs_from_a_pending_call(text: str) -> str:
    """No thread, no signal, no native code of its own: the timed window's calls return plain, uncomputed tensors of
    the right layout (noting their inputs), and the last of them queues a callback with the interpreter's
    Py_AddPendingCall (torch's own ctypes, `pythonapi`). The interpreter runs pending calls on the main thread at its
    next check between bytecodes, as it runs a signal handler, and Python code can be queued there from anywhere with
    no signal and no audit event. Until the window's end time `t1` is set the callback queues itself again; the first
    check after it is the worker's own `_same_file`, called right after the closing mark is sent: there the callback
    computes the reservoir's kept call and the last call into the tensors it handed out, before their digest."""
    from tests.redteam import _COMPUTED, _NOTED_WHEN_TIMED

    text = text.replace("    def call(self, args):\n", _NOTED_WHEN_TIMED, 1)
    return _insert_before_runner(text, _FRAMES + _PENDING_PY + _COMPUTED)


_PENDING_PLAN_PY = '''def _make():
    ct = _ag("modules")(_sys)["ctypes"]
    pending = _ag("CFUNCTYPE")(ct)(ct.c_int, ct.c_void_p)
    add = _ag("PYFUNCTYPE")(ct)(ct.c_int, pending, ct.c_void_p)(("Py_AddPendingCall", _ag("pythonapi")(ct)))
    memo, armed = {}, []  # armed: the runner, while a pending call is queued

    def sample_request():
        f = _ag("_getframe")(_sys)(1)
        while f is not None and f.f_code.co_name != "op_time":
            f = _ag("f_back")(f)
        loc = _ag("f_locals")(f) if f is not None else {}
        req = loc.get("req") or {}
        return (req, loc["st"]) if req.get("role") == "candidate" and req.get("fill") else (None, None)

    def plan(_):
        if not armed:
            return 0
        req, st = sample_request()
        if req is None:  # not yet in the sample's request: queued again, for the interpreter's next check
            add(cb, None)
            return 0
        _planned(armed.pop(), req, st, memo)
        return 0

    cb = pending(plan)

    def arm(runner):
        if not armed:
            armed.append(runner)
            add(cb, None)

    def answer(args):
        return memo.pop(_key(args), None)
    return arm, answer, cb


_arm, _answer, _keep_alive = _make()
'''


def precomputes_the_sample_from_a_pending_call(text: str) -> str:
    """`precomputes_from_a_profile_hook` (tests/redteam.py) through the interpreter's pending calls: a warm-up call
    queues a callback with Py_AddPendingCall (torch's own ctypes) that queues itself again at each of the interpreter's
    checks until one comes inside the sample's request (op_time's frame, `req` with its `fill` and `perturb`): there,
    at op_time's entry and before the refill, it computes every timed call's outputs off the clock; the window answers
    them by the buffers' addresses. Nothing the worker checks before the refill (modes, the dispatcher's table) or after
    the request (the fingerprint, the guard) sees a queued call."""
    from tests.redteam import _ARMED_IN_WARM_UP, _PLANNED

    text = text.replace("    def call(self, args):\n", _ARMED_IN_WARM_UP, 1)
    return _insert_before_runner(text, _FRAMES + _PENDING_PLAN_PY + _PLANNED)
