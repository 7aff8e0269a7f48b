"""What the kernel says about a gate worker from outside it (/proc): nothing the worker runs can change it."""

from __future__ import annotations

import os
from dataclasses import dataclass

_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 1e7


def process_tree(pid: int) -> list[int]:
    """Process `pid` and every process under it (children of any of its threads, recursively), as /proc lists them
    now; a process gone since it was listed is left out of the walk below it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children", "rb") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return out


def tree_cpu_ns(pid: int) -> int:
    """CPU time (user and system, every thread, live or ended, and reaped children) of process `pid` and
    of every process under it, from /proc, in ns (the kernel's clock-tick resolution: 10 ms on Linux).
    Read from outside the process, so nothing the process runs can change it; 0 where /proc is absent.
    A child that detaches from the tree leaves it, but not the sandbox: in the sandbox's PID namespace
    an orphan's new parent is the worker itself."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                raw = f.read()
            fields = raw[raw.rindex(b")") + 2:].split()  # fields 3.. of proc(5); the name may hold spaces
            total += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        except (OSError, ValueError, IndexError):
            continue  # gone since it was listed
    return int(total * _TICK_NS)


def _states(pid: int) -> list[bytes]:
    """The scheduler state of every thread of process `pid` (proc(5) stat field 3); [] where it is gone."""
    out = []
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{t}/stat", "rb") as f:
                    raw = f.read()
                out.append(raw[raw.rindex(b")") + 2:][:1])
            except (OSError, ValueError):
                continue  # a thread that ended since it was listed
    except OSError:
        return []
    return out


class FreezeFailed(Exception):
    """A process tree that could not be stopped whole."""


def freeze(pid: int, timeout_s: float = 5.0) -> list[int]:
    """SIGSTOP process `pid` and every process under it, and return once every thread of each is stopped (a
    process forked meanwhile is found and stopped too). Sent from outside the tree, SIGSTOP cannot be caught,
    blocked or ignored, not even by the first process of a PID namespace. The pids stopped; thaw() resumes them."""
    import signal
    import time

    stopped: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        tree = process_tree(pid)
        for p in tree:
            if p not in stopped:
                try:
                    os.kill(p, signal.SIGSTOP)
                except ProcessLookupError:
                    continue
                stopped.append(p)
        if all(s in (b"T", b"t", b"Z", b"X") for p in tree for s in _states(p)) and process_tree(pid) == tree:
            return stopped
        if time.monotonic() > deadline:
            thaw(stopped)
            raise FreezeFailed(f"process {pid}'s tree did not stop within {timeout_s:.0f} s")
        time.sleep(0)


def thaw(pids: list[int]) -> None:
    import signal

    for p in pids:
        try:
            os.kill(p, signal.SIGCONT)
        except ProcessLookupError:
            continue


def read_memory(pid: int, address: int, n: int) -> bytes:
    """n bytes of process `pid`'s memory from `address`, read through /proc (the process should be stopped:
    freeze); OSError where any of it is not mapped or cannot be read."""
    if n == 0:
        return b""
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        parts, done = [], 0
        while done < n:
            chunk = os.pread(fd, min(n - done, 1 << 26), address + done)
            if not chunk:
                raise OSError(f"nothing at {address + done:#x} in process {pid}")
            parts.append(chunk)
            done += len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def write_memory(pid: int, address: int, data) -> None:
    """Write `data` (bytes-like) into process `pid`'s memory at `address`, through /proc (the process should be
    stopped: freeze); OSError where any of it is not mapped or cannot be written."""
    view = memoryview(data).cast("B")
    if not len(view):
        return
    fd = os.open(f"/proc/{pid}/mem", os.O_WRONLY)
    try:
        done = 0
        while done < len(view):
            n = os.pwrite(fd, view[done:done + (1 << 26)], address + done)
            if n <= 0:
                raise OSError(f"nothing written at {address + done:#x} in process {pid}")
            done += n
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Sched:
    """What the scheduler says of a stopped worker's tree at one moment (sched()); two of them bound a sample."""

    waited_ns: int  # the serving thread's time runnable but not running, so far (schedstat's run_delay)
    own_ns: int  # the serving thread's CPU time so far (schedstat's sum_exec_runtime)
    cpu_ns: int  # every process of the tree: its threads' CPU time, live or ended (the process's CPU clock)
    reaped: int  # every process's reaped children's CPU time, in clock ticks (cutime + cstime)
    tasks: frozenset  # (pid, tid) of every thread of the tree
    threads: tuple = ()  # ((pid, tid), CPU time, run delay) of every thread, from its schedstat, in ns
    cpus: int = 0  # how many CPUs the tree's threads may run on, all together (their affinities' union)


def sched(pids: list[int], serving: int, tid: int | None = None) -> Sched | None:
    """The tree `pids` (stopped) as the scheduler accounts for it; `serving`: the pid whose thread `tid` (its main
    thread where None) serves the gate's requests. None where any of it cannot be read."""
    import time

    tasks, cpu, reaped, mine, threads, allowed = set(), 0, 0, None, [], set()
    try:
        for p in pids:
            for t in os.listdir(f"/proc/{p}/task"):
                tasks.add((p, int(t)))
                with open(f"/proc/{p}/task/{t}/schedstat", "rb") as f:
                    run, delay = (int(x) for x in f.read().split()[:2])
                threads.append(((p, int(t)), run, delay))
                allowed |= os.sched_getaffinity(int(t))
            # A process's CPU clock, readable for any process in our PID namespace: ns, ended threads included.
            cpu += time.clock_gettime_ns(((~p) << 3) | 2)  # CPUCLOCK_SCHED of the whole process (posix-cpu-timers)
            with open(f"/proc/{p}/stat", "rb") as f:
                raw = f.read()
            reaped += sum(int(x) for x in raw[raw.rindex(b")") + 2:].split()[13:15])  # cutime, cstime
        with open(f"/proc/{serving}/task/{tid or serving}/schedstat", "rb") as f:
            mine = [int(x) for x in f.read().split()[:2]]
    except (OSError, ValueError, IndexError):
        return None
    return Sched(mine[1], mine[0], cpu, reaped, frozenset(tasks), tuple(sorted(threads)), len(allowed))


def forgiven_ns(a: Sched | None, b: Sched | None, span_ns: int) -> int:
    """Of a sample that spanned `span_ns` between a and b, the part that was the machine's wait for a CPU: as long as
    the thread that waited least of those that ran meanwhile (each was runnable and not running at least that long),
    but never so much that the sample falls below what the tree's work takes on an idle machine: its busiest thread's
    CPU time, and all its threads' CPU time over the CPUs they may use. So nothing of the candidate's gains by it:
    threads that crowd one another onto the worker's cores are counted over those cores, and one that works while
    another waits is counted in full (spinning to stay runnable costs CPU time, which is counted). 0 where the tree's
    threads or processes changed, or a reaped child's time grew: work that would not be counted."""
    if a is None or b is None or a.tasks != b.tasks or a.reaped != b.reaped or not b.threads:
        return 0
    before = {t: (run, delay) for t, run, delay in a.threads}
    ran = []
    for t, run, delay in b.threads:
        r0, d0 = before.get(t, (run, delay))
        if run > r0:
            ran.append((run - r0, delay - d0))
    if not ran:
        return 0
    work = max(0, b.cpu_ns - a.cpu_ns)
    floor = max(max(r for r, _ in ran), -(-work // max(1, b.cpus, a.cpus)))
    return max(0, min(min(d for _, d in ran), span_ns - floor))


def cpu_pressure_us() -> int | None:
    """Microseconds, since boot, in which some runnable task on the machine waited for a CPU (the kernel's pressure
    stall information, /proc/pressure/cpu `some total`); None where the kernel does not keep it."""
    try:
        with open("/proc/pressure/cpu", "rb") as f:
            for line in f.read().decode().splitlines():
                if line.startswith("some "):
                    return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        pass
    return None
