"""The kernel's word on what a gate worker may still do once its candidate has loaded (seccomp-bpf, Linux).

A signal handler is handed the running frame and runs between any two bytecodes of the worker: armed on a timer, a
candidate's handler filled its checked outputs after the timed window closed (accepted 4 of 4, 20-55x) or computed a
sample before its window opened (accepted 3 of 6); no audit event exists for `signal.signal` or `setitimer`, and a
handler that removes itself within a request leaves nothing for the worker's checks to find. So once the candidate
has loaded (its module's own code has run, and the checks after that request see any handler or timer it left), the
worker asks the kernel to refuse, for good and in every thread, installing a signal handler and arming a timer:

    rt_sigaction, sigaction, signal, alarm, setitimer, timer_create, timer_settime  -> EPERM

and, in a CPU worker, starting a process (fork, vfork, clone without CLONE_THREAD -> EPERM; clone3 -> ENOSYS): the
parent takes a CPU sample's wait for a core out of its time less the CPU time of every thread and process in the
worker's tree (gate/procfs.forgiven_ns), and a child that worked and was reaped within a sample would leave no time
to charge. Threads still start; CUDA workers keep the first list only (their runtime's own helpers are not checked
here).

A filter can never be removed or loosened by the process it binds, whatever its code does (ctypes included), and it
is inherited by every thread and child. Honest wrappers install no handlers and arm no timers; the GPU machine's
checks (a Triton launch, cuBLAS, a CUDA graph's capture and replay after such a filter) are in
/work/shared/notes/os-confinement.md's verification. Unknown architectures: nothing installed, and `install` says so.
"""

from __future__ import annotations

import ctypes
import errno
import platform

# (audit architecture, syscall numbers refused, the seccomp(2) syscall's number)
_ARCH = {
    "x86_64": (0xC000003E, (13, 37, 38, 222, 223), 317),  # rt_sigaction, alarm, setitimer, timer_create, timer_settime
    "aarch64": (0xC00000B7, (134, 103, 107, 110), 277),  # rt_sigaction, setitimer, timer_create, timer_settime
}
_FORKS = {"x86_64": (57, 58), "aarch64": ()}  # fork, vfork (aarch64 has only clone and clone3)
_CLONE = {"x86_64": (56, 435), "aarch64": (220, 435)}  # clone, clone3
_CLONE_THREAD = 0x00010000
_X32_BIT = 0x40000000  # x86_64's x32 syscalls: another number for the same calls, refused as a whole

_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, JGE, JSET, BPF_RET|BPF_K
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1


class _Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn))]


def program(machine: str | None = None, processes: bool = False) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions: on this architecture, each refused call fails with EPERM (and
    on x86_64 every x32 call too); anything else, and any other architecture's call, is allowed.
    processes: also refuse starting a process (fork, vfork, a clone without CLONE_THREAD: EPERM; clone3, whose flags
    a filter cannot read: ENOSYS, and the C library starts its threads with clone instead). Threads still start."""
    machine = machine or platform.machine()
    arch, refused, _ = _ARCH[machine]
    deny = (_RET, 0, 0, _ERRNO | errno.EPERM)
    out = [(_LD_ABS, 0, 0, 4),  # seccomp_data.arch
           (_JEQ, 1, 0, arch), (_RET, 0, 0, _ALLOW),
           (_LD_ABS, 0, 0, 0)]  # seccomp_data.nr
    checks = [(_JGE, 0, 0, _X32_BIT)] if machine == "x86_64" else []
    checks += [(_JEQ, 0, 0, nr) for nr in refused + (_FORKS[machine] if processes else ())]
    clone, clone3 = _CLONE[machine]
    # clone3 -> ENOSYS (after allow and deny); clone: its flags (args[0]) with CLONE_THREAD -> allow, else deny.
    tail = [(_JEQ, 5, 0, clone3), (_JEQ, 0, 2, clone), (_LD_ABS, 0, 0, 16), (_JSET, 0, 1, _CLONE_THREAD)] \
        if processes else []
    for i, (code, _, _, k) in enumerate(checks):  # a match jumps to the deny after the tail and the allow
        out.append((code, len(checks) + len(tail) - i, 0, k))
    out += tail + [(_RET, 0, 0, _ALLOW), deny]
    return out + ([(_RET, 0, 0, _ERRNO | errno.ENOSYS)] if processes else [])


def install(processes: bool = False) -> str:
    """Bind this process, every thread of it and every child to the filter (`processes`: program's); "" when in
    place, else why not (the worker reports it; the gate's other lines still hold)."""
    if platform.system() != "Linux" or platform.machine() not in _ARCH:
        return f"no seccomp filter for {platform.system()} {platform.machine()}"
    insns = program(processes=processes)
    arr = (_Insn * len(insns))(*[_Insn(*i) for i in insns])
    prog = _Prog(len(insns), arr)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return "prctl(PR_SET_NO_NEW_PRIVS) failed: " + errno.errorcode.get(ctypes.get_errno(), "?")
    nr = _ARCH[platform.machine()][2]
    if libc.syscall(nr, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(prog)) == 0:
        return ""
    # Without TSYNC (an old kernel): this thread and those it starts; the worker's Python runs on this one.
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0:
        return ""
    return "seccomp filter refused: " + errno.errorcode.get(ctypes.get_errno(), "?")
