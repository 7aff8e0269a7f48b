"""The artifact store under TILESMITH_HOME: what the runtime loads instead of Inductor's wrappers.

    artifacts/<key>.py     the accepted source (FX header included), exactly the bytes the gate judged
    manifests/<key>.json   sha256 of that file, the graph key and environment it is valid for,
                           provenance (optimizer, model, agency, loops, budget, threshold, run id)
                           and the gate evidence that accepted it (speedup and interval, mode,
                           correctness numbers)
    locks/<key>.lock       an fcntl lock held while one key is being changed

Writes are atomic (temp file + os.replace) and the manifest is written last and removed first, so a
reader that finds a manifest finds its artifact. A reader that races a replacement may briefly see
the new artifact with the old manifest: the sha256 check then fails and the runtime keeps
Inductor's code for that process, never runs unverified bytes. Stdlib only.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tilesmith import paths
from tilesmith.environment import fingerprint_id
from tilesmith.errors import TilesmithError

MANIFEST_FORMAT = 1
_KEY_RX = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class Evidence:
    """What the gate measured when it accepted the artifact (speedup = baseline/candidate)."""

    speedup: float
    speedup_low: float  # one-sided lower confidence bound: what replacement decisions compare
    speedup_high: float
    mode: str  # launch | graph (CUDA-graph replay)
    samples: int = 0
    baseline_ms: float | None = None
    candidate_ms: float | None = None
    max_abs_error: float | None = None  # worst over all input sets and passes, candidate vs original
    max_rel_error: float | None = None
    correctness_sets: int = 0


@dataclass
class Manifest:
    key: str
    sha256: str  # of artifacts/<key>.py's bytes
    kind: str  # forward | backward | inference
    environment: dict
    environment_id: str
    evidence: Evidence
    provenance: dict = field(default_factory=dict)  # optimizer, model, agency, loops, budget, threshold, run_id, ...
    installed: str = ""  # ISO time, UTC
    format: int = MANIFEST_FORMAT

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Manifest:
        d = dict(d)
        d["evidence"] = Evidence(**d["evidence"])
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass
class PutResult:
    key: str
    action: str  # installed | replaced | kept | would-install | would-replace
    reason: str
    manifest: Manifest | None = None  # what is in the store for the key afterwards (or would be)


def artifact_path(key: str) -> Path:
    return paths.artifacts_dir() / f"{key}.py"


def manifest_path(key: str) -> Path:
    return paths.manifests_dir() / f"{key}.json"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@contextlib.contextmanager
def key_lock(key: str):
    """Exclusive fcntl lock on locks/<key>.lock; other processes changing the same key wait."""
    _check_key(key)
    d = paths.locks_dir()
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"{key}.lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def is_better(new: Evidence, old: Evidence) -> bool:
    """New evidence wins only when its lower confidence bound beats the old one's (conservative)."""
    return new.speedup_low > old.speedup_low


def put(key: str, data: bytes, *, kind: str, environment: dict, evidence: Evidence, provenance: dict,
        force: bool = False, dry_run: bool = False) -> PutResult:
    """Install `data` as the artifact of `key` unless a better (or equal) artifact is already there.

    The caller vouches that the gate accepted exactly `data` for `key`: install.py checks that.
    """
    _check_key(key)
    new = Manifest(key=key, sha256=sha256_bytes(data), kind=kind, environment=environment,
                   environment_id=fingerprint_id(environment), evidence=evidence, provenance=dict(provenance),
                   installed=now_iso())
    with key_lock(key):
        old = _read_valid(key)
        if old is not None and not force:
            if old.sha256 == new.sha256:
                return PutResult(key, "kept", "the same source is already installed", old)
            if not is_better(evidence, old.evidence):
                return PutResult(key, "kept", f"the installed artifact's evidence is as good or better "
                                              f"(lower bound {old.evidence.speedup_low:.3f}x >= "
                                              f"{evidence.speedup_low:.3f}x)", old)
        verb = "replace" if old is not None else "install"
        why = (f"replaces an artifact with lower bound {old.evidence.speedup_low:.3f}x" + (" (forced)" if force else "")
               if old is not None else "first artifact for this graph")
        if dry_run:
            return PutResult(key, f"would-{verb}", why, new)
        paths.artifacts_dir().mkdir(parents=True, exist_ok=True)
        paths.manifests_dir().mkdir(parents=True, exist_ok=True)
        _atomic_write(artifact_path(key), data)
        _atomic_write(manifest_path(key), (json.dumps(new.to_dict(), indent=2, sort_keys=True) + "\n").encode())
        return PutResult(key, "replaced" if old is not None else "installed", why, new)


def get(key: str) -> Manifest | None:
    """The manifest of `key`, or None when nothing (or something unreadable) is installed."""
    return _read_valid(key)


def list_installed() -> list[Manifest]:
    """Every readable manifest, newest first."""
    d = paths.manifests_dir()
    found = []
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        m = _read_valid(p.stem) if _KEY_RX.match(p.stem) else None
        if m is not None:
            found.append(m)
    return sorted(found, key=lambda m: m.installed, reverse=True)


def resolve(prefix: str) -> str:
    """The one installed key starting with `prefix`."""
    d = paths.manifests_dir()
    keys = sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []
    hits = [k for k in keys if k.startswith(prefix.lower())] if prefix else []
    if len(hits) != 1:
        raise TilesmithError(f"'{prefix}' matches {len(hits)} installed artifacts", code="artifact-not-found",
                             hint="`tilesmith installed` lists the keys; give a longer prefix")
    return hits[0]


def remove(key: str) -> bool:
    """Remove one artifact (manifest first, so the runtime stops using it at once). True if it existed."""
    with key_lock(key):
        existed = manifest_path(key).exists() or artifact_path(key).exists()
        for p in (manifest_path(key), artifact_path(key)):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    return existed


def revoke(key: str, reason: str) -> bool:
    """Remove an artifact that a program found wrong (TILESMITH_VERIFY), keeping why in revoked.jsonl beside the store,
    so no later run loads it and `tilesmith installed` can say what happened. True if it was installed."""
    existed = remove(key)
    if existed:
        line = json.dumps({"key": key, "when": now_iso(), "reason": reason[:500]}) + "\n"
        paths.home().mkdir(parents=True, exist_ok=True)
        with open(paths.home() / "revoked.jsonl", "a") as f:
            f.write(line)
    return existed


def revoked() -> list[dict]:
    """The artifacts programs removed after a failed check, oldest first (revoke)."""
    try:
        lines = (paths.home() / "revoked.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def remove_all() -> list[str]:
    """Remove every installed artifact; returns their keys."""
    d = paths.manifests_dir()
    keys = {p.stem for p in d.glob("*.json")} if d.is_dir() else set()
    a = paths.artifacts_dir()
    keys |= {p.stem for p in a.glob("*.py")} if a.is_dir() else set()
    keys = sorted(k for k in keys if _KEY_RX.match(k))
    for k in keys:
        remove(k)
    return keys


def verify(key: str) -> str:
    """'' when the artifact's bytes hash to its manifest, else why not (for `installed`)."""
    m = _read_valid(key)
    if m is None:
        return "manifest missing or unreadable"
    try:
        data = artifact_path(key).read_bytes()
    except FileNotFoundError:
        return "artifact file missing"
    return "" if sha256_bytes(data) == m.sha256 else "artifact bytes do not match the manifest's sha256"


def _read_valid(key: str) -> Manifest | None:
    try:
        return Manifest.from_dict(json.loads(manifest_path(key).read_text()))
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError):
        return None


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def is_key(name: str) -> bool:
    """A graph key: 64 lowercase hex (also the name of a track folder in a run)."""
    return bool(_KEY_RX.match(name or ""))


def _check_key(key: str) -> None:
    if not is_key(key):
        raise TilesmithError(f"'{key}' is not a graph key (64 lowercase hex)", code="bad-key")
