"""Spare gate workers: interpreters started ahead of need, and the workers kept between decisions.

Starting a worker (an interpreter, torch, a CUDA context) is most of a decision's wall time: seconds
on CPU, 7-11 s on an H200 host. When decisions run back to back (the optimize driver), interpreters
are started ahead of need. Each is handed out once, and fresh: it has run its imports and nothing
else (no wrapper, no candidate). One is handed out only if the environment it would be started with
now is the one it was started with; otherwise a new worker starts as before."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
import weakref
from pathlib import Path

from tilesmith import settings
from tilesmith.gate.proc import Worker
from tilesmith.launch import sandbox
from tilesmith.launch.secrets import is_secret


class _Spare:
    def __init__(self, device: str, home: Path, fingerprint: str, readable: tuple):
        self.device, self.fingerprint = device, fingerprint
        self.worker = Worker("spare", home, device, readable)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._ready, daemon=True)
        self._thread.start()

    def _ready(self) -> None:
        try:
            self.worker.request({"op": "ready"}, 300.0)
        except BaseException as e:  # a spare that cannot start is dropped; a fresh worker is used instead
            self.error = e

    def idle(self) -> None:
        self._thread.join()

    @property
    def ready(self) -> bool:
        """Started, answered, and still alive: it may be handed out."""
        return not self._thread.is_alive() and self.error is None and self.worker.proc.poll() is None


class Spares:
    """Up to `per_device` started workers per device, refilled when a decision ends (see above). A
    spare's sandbox can read the graph folder it was started for: it is handed out for that graph only."""

    def __init__(self, per_device: int):
        self.per_device = per_device
        self._home = Path(tempfile.mkdtemp(prefix="tilesmith-spares-"))
        self._lock = threading.Lock()
        self._pool: dict[str, list[_Spare]] = {}
        self._kept: dict[tuple, Worker] = {}  # (role, key) -> a worker that has run only the original
        self._closed = False
        _LIVE.add(self)

    @property
    def home(self) -> Path:
        """Where the pool's workers keep their folders: outside any one decision's scratch folder."""
        return self._home

    # Workers that run only trusted code (the original: the reference worker, the timer) carry nothing a
    # candidate did and are reused by the next decision on the same graph with the same baseline: a
    # decision then starts one interpreter (its candidate's) instead of three.
    KEEP_PER_ROLE = 2

    def reuse(self, role: str, key: tuple) -> "Worker | None":
        """The worker kept for (role, key), if one is, still alive, and was started in this environment."""
        with self._lock:
            w = self._kept.pop((role, key), None)
        if w is not None and w.proc.poll() is None:
            return w
        if w is not None:
            w.close()
        return None

    def keep(self, role: str, key: tuple, worker: "Worker") -> None:
        """Keep `worker` (it ran only the original, and is idle) for the next decision with the same key;
        the oldest of the role's kept workers goes beyond KEEP_PER_ROLE."""
        drop = []
        with self._lock:
            if self._closed or worker.proc.poll() is not None:
                drop.append(worker)
            else:
                old = self._kept.pop((role, key), None)
                drop += [old] if old is not None else []
                self._kept[(role, key)] = worker
                same = [k for k in self._kept if k[0] == role]
                for k in same[:max(0, len(same) - self.KEEP_PER_ROLE)]:
                    drop.append(self._kept.pop(k))
        for w in drop:
            w.close()

    def trusted_key(self, device: str, readable: tuple, *parts) -> tuple:
        """A kept worker's key: the environment it would start with now, and what it loaded."""
        return (_env_fingerprint(device, readable), device, *parts)

    def take(self, name: str, scratch: Path, device: str, readable: tuple = ()) -> "Worker":
        fp = _env_fingerprint(device, readable)
        with self._lock:
            pool = self._pool.setdefault(device, [])
            spare = next((s for s in pool if s.fingerprint == fp and s.ready), None)
            if spare is not None:
                pool.remove(spare)
        if spare is None:
            return Worker(name, scratch, device, readable)
        spare.worker.name = name
        return spare.worker

    def refill(self, device: str, readable: tuple = ()) -> None:
        """Start spares up to the pool's size. Called when a decision is over, so they start while the
        optimizer prepares its next candidate, not while this decision measures."""
        with self._lock:
            self._fill(device, _env_fingerprint(device, readable), tuple(readable))

    def _fill(self, device: str, fp: str, readable: tuple) -> None:
        if self._closed:
            return
        pool = self._pool.setdefault(device, [])
        for s in [s for s in pool if s.fingerprint != fp or s.error is not None]:  # stale: never handed out
            pool.remove(s)
            s.worker.close()
        while len(pool) < self.per_device:
            pool.append(_Spare(device, self._home, fp, readable))

    def calm(self) -> None:
        """Wait until no spare is starting (a starting interpreter would disturb a measurement)."""
        with self._lock:
            starting = [s for pool in self._pool.values() for s in pool]
        for s in starting:
            s.idle()

    def close(self) -> None:
        _LIVE.discard(self)
        with self._lock:
            self._closed = True
            spares = [s for pool in self._pool.values() for s in pool]
            self._pool.clear()
            kept, self._kept = list(self._kept.values()), {}
        for w in kept:
            w.close()
        for s in spares:
            s.worker.kill()
            s.idle()
            s.worker.close()
        shutil.rmtree(self._home, ignore_errors=True)


# Pools alive now, only so that a measurement anywhere (the tuner's screen, a profile) can wait for
# interpreters still starting. Which worker a decision gets depends only on the pool passed to judge().
_LIVE: "weakref.WeakSet[Spares]" = weakref.WeakSet()


def _env_fingerprint(device: str, readable: tuple = ()) -> str:
    items = sorted((k, v) for k, v in os.environ.items() if not is_secret(k))
    return hashlib.sha256(json.dumps([device, items, [str(p) for p in readable], sandbox.mode()]).encode()).hexdigest()


def start_worker(name: str, scratch: Path, device: str = "cpu", readable: tuple = (),
                 spares: Spares | None = None) -> "Worker":
    """A worker for one role of one decision: a started spare from `spares` when given, else a new one."""
    return spares.take(name, scratch, device, readable) if spares is not None else Worker(name, scratch, device, readable)


def calm_spares() -> None:
    """Before any measurement: wait for spares still starting, in every live pool."""
    for pool in list(_LIVE):
        pool.calm()


def default_spares() -> int:
    """TILESMITH_GATE_SPARES, else one decision's worth (reference, first pass, confirmation) on a
    machine with 4 or more cores and one on a smaller machine, where starting interpreters compete
    with the decision for the same cores."""
    given = settings.current().gate_spares
    if given is not None:
        try:
            return max(0, int(given))
        except ValueError:
            from tilesmith.errors import TilesmithError

            raise TilesmithError(f"TILESMITH_GATE_SPARES={given!r} is not a number", code="usage",
                                 hint="set it to 0 (off) or the number of workers to keep started") from None
    return 3 if usable_cores() >= 4 else 1


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextlib.contextmanager
def keep_spares(per_device: int):
    """A pool of `per_device` started workers per device for the block (None when off): pass it to
    judge(..., spares=pool) for decisions that run back to back."""
    if per_device <= 0:
        yield None
        return
    pool = Spares(per_device)
    try:
        yield pool
    finally:
        pool.close()
