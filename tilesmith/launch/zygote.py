"""Workers forked from an interpreter that has already imported torch: `python -m tilesmith.launch.zygote SOCK_FD`.

Starting a worker is mostly an interpreter importing torch and Inductor: about 3.6 s of CPU on the
2-core VM, 12-13 s on the H200 host, several times per gate decision. The zygote pays that once per
deciding process (and environment): it imports those modules and nothing else. It runs no graph, no
wrapper, no candidate and no torch operator, and never touches CUDA. For each worker it forks a process
(the keeper) that enters the same OS sandbox as `unshare` and stage.py build (new
user, mount, network and PID namespaces, the same file-system view) and forks the namespace's first
process, which runs `python -m MODULE ARGS` through runpy with the worker's own environment, working
folder and file descriptors. No candidate code ever ran in any ancestor of a worker, so each is as
fresh as one started from scratch: what the gate relies on (the original timed where candidate code
never ran, process-state fingerprints) holds unchanged.

The keeper stays outside the new PID namespace: it waits for the worker, writes its exit status on a
pipe the deciding process reads, and kills it when the deciding process's lifeline closes. Killing the
keeper's process group kills the worker too, and when the worker ends the kernel ends everything left
in its PID namespace. Protocol: one SOCK_SEQPACKET message per worker (a JSON header and the file
descriptors), answered with {"pid": KEEPER_PID} or {"error": ...}.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import signal
import socket
import struct
import sys
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)

# What every worker imports first (torch, Inductor's loading and wrapper-header modules, the gate
# worker's own helpers): trusted modules, imported here once. The worker modules themselves are not
# (runpy runs them as __main__, fresh, in each worker; the gate worker's serve.py is imported by its __main__ then,
# and its ops' modules setup.py, sample.py and checks.py with it).
PRELOAD = ("torch", "torch._inductor.codecache", "tilesmith.capture.loading", "torch._inductor.async_compile",
           "torch._inductor.codegen.memory_planning", "torch._inductor.hooks", "torch._inductor.select_algorithm",
           "torch._inductor.utils", "torch._inductor.codegen.multi_kernel", "tilesmith.capture.tensors",
           "tilesmith.gate.clock", "tilesmith.errors", "tilesmith.gate.worker.patches",
           "tilesmith.gate.worker.fingerprint", "tilesmith.gate.inputs", "tilesmith.gate.worker.outputs",
           "tilesmith.gate.worker.tensors", "tilesmith.launch.stage")


def _preload() -> tuple[str, str | None]:
    """Import PRELOAD; the CUDA driver's state after it (cuda_driver_state) and the first module whose import
    initialised the driver, if one did (the reply names it: the deciding process then starts CUDA workers
    as new interpreters, and says why).
    torch.cuda.is_available() initialises the driver (cudaGetDeviceCount) unless
    PYTORCH_NVML_BASED_CUDA_CHECK=1, which makes it ask NVML, as torch.cuda.device_count() already does:
    set here, for the zygote's own imports (each worker gets its environment exactly as asked)."""
    import importlib

    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    state, culprit = "absent", None
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # absent in this torch version: the worker that needs it says so itself
            pass
        if state != "initialised":  # initialised stays so: no probe after that
            state = cuda_driver_state()
            culprit = name if state == "initialised" else None
    return state, culprit


def _libcuda_mapped() -> bool:
    try:
        with open("/proc/self/maps") as f:
            return any("libcuda.so" in line for line in f)
    except OSError:
        return False


def cuda_driver_state() -> str:
    """'absent': the CUDA driver library is not mapped into this process (importing torch alone does not
    map it); 'loaded': mapped (Triton's import maps it on a GPU machine) but never initialised, which a
    forked child can still do itself; 'initialised': cuInit has run (any CUDA call, even
    torch.cuda.is_available(), runs it), and a process forked after that cannot use CUDA, so the deciding
    process then forks nothing from this zygote. The probe is cuCtxGetCurrent on the copy already mapped:
    before cuInit every driver call but a few answers CUDA_ERROR_NOT_INITIALIZED, and none initialises."""
    if not _libcuda_mapped():
        return "absent"
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)  # only the copy already mapped, never another
        ctx = ctypes.c_void_p()
        rc = lib.cuCtxGetCurrent(ctypes.byref(ctx))
    except (OSError, AttributeError):
        return "initialised"  # cannot tell: the careful answer
    return "loaded" if rc == 3 else "initialised"  # 3: CUDA_ERROR_NOT_INITIALIZED


def _enter_namespaces() -> None:
    """What `unshare --user --map-root-user --mount --pid --net --ipc --uts` does to its own process."""
    from tilesmith.launch import stage as st

    st.enter_user_namespace(st.CLONE_NEWNS | st.CLONE_NEWNET | st.CLONE_NEWPID | st.CLONE_NEWIPC | st.CLONE_NEWUTS)


def _place_fds(fds: list[int], targets: list[int]) -> None:
    """Give the received descriptors the numbers the worker's argv names; close every other one."""
    top = max(targets + fds) + 1
    high = [_dup_above(fd, top + i) for i, fd in enumerate(fds)]
    for h, t in zip(high, targets):
        os.dup2(h, t, inheritable=True)
    keep = set(targets)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _dup_above(fd: int, low: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, low)


_ZYGOTE_PATHS: dict = {}  # the zygote's own folders, each worker's counterpart in its environment


def _refresh_paths() -> None:
    """What the preloaded modules computed at import from the zygote's folders, computed again from the
    worker's, as a new interpreter would: Inductor's precompiled-header folder (TMPDIR), and any config
    value of Inductor or Dynamo under the zygote's TMPDIR, HOME or working folder (xpu.cutlass_dir is the
    working folder) moved to the worker's."""
    mods = sys.modules
    mine = {"TMPDIR": os.environ.get("TMPDIR", ""), "HOME": os.environ.get("HOME", ""), "cwd": os.getcwd()}
    pairs = sorted(((_ZYGOTE_PATHS[k], mine[k]) for k in _ZYGOTE_PATHS if _ZYGOTE_PATHS[k] and mine[k]),
                   key=lambda p: len(p[0]), reverse=True)
    for name in ("torch._inductor.config", "torch._dynamo.config"):
        cfg = mods.get(name)
        if cfg is None or not hasattr(cfg, "get_config_copy"):
            continue
        for key, value in cfg.get_config_copy().items():
            if not isinstance(value, str):
                continue
            for old, new in pairs:
                if value == old or value.startswith(old.rstrip(os.sep) + os.sep):
                    obj = cfg
                    *parents, leaf = key.split(".")
                    for part in parents:
                        obj = getattr(obj, part)
                    setattr(obj, leaf, new + value[len(old):])
                    break
    cc = mods.get("torch._inductor.codecache")
    if cc is not None and hasattr(cc, "_HEADER_DIR") and hasattr(cc, "default_cache_dir"):
        cc._HEADER_DIR = os.path.join(cc.default_cache_dir(), "precompiled_headers")
        cc._HEADER_LOCK_DIR = os.path.join(cc._HEADER_DIR, "locks")
    wb = mods.get("torch._inductor.wrapper_benchmark")
    if wb is not None and hasattr(wb, "PROFILE_DIR"):
        import tempfile

        wb.PROFILE_DIR = tempfile.gettempdir()


def _run(req: dict, fds: list[int]) -> None:
    """The worker: inside the namespaces (as their first process), or beside the keeper at env-only."""
    code = 97
    try:
        _libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: dies with its keeper
        cwd = req["cwd"]
        os.chdir(cwd)
        if req.get("spec"):
            from tilesmith.launch import stage

            stage._setup(req["spec"], cwd)
        _place_fds(fds, req["targets"])
        os.environ.clear()
        os.environ.update(req["env"])
        import random
        import tempfile

        tempfile.tempdir = None  # gettempdir() reads the worker's TMPDIR again
        _refresh_paths()
        random.seed()  # a fresh interpreter seeds from the OS; a fork would share the zygote's state
        sys.argv = [req["module"], *req["args"]]
        sys.path[0] = cwd  # what `python -m` puts first
        code = 1
    except BaseException as e:  # noqa: BLE001 - the sandbox could not be built: refuse to run the worker
        try:
            os.write(2, f"tilesmith sandbox: {e}\n".encode())
        finally:
            os._exit(code)
    import runpy
    import traceback

    try:
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - what an interpreter prints on an uncaught exception
        traceback.print_exc()
        code = 1
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    os._exit(code & 0xFF)


def _keeper(req: dict, fds: list[int], life_fd: int) -> None:
    """The keeper: sets up the namespaces, forks the worker, reports its exit status, never returns."""
    status_w = fds[-1]
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the zygote ignores it (auto-reap); a waiter must not
        os.setsid()  # its own process group: the deciding process kills the group
        if req.get("spec"):
            _enter_namespaces()
        pid = os.fork()
    except BaseException as e:  # noqa: BLE001
        try:
            os.write(fds[2], f"tilesmith sandbox: {e}\n".encode())
        finally:
            os._exit(97)
    if pid == 0:
        os.close(life_fd)
        os.close(status_w)
        _run(req, fds[:-1])
    for fd in fds[:-1]:
        os.close(fd)
    status = _wait(pid, life_fd)
    if os.WIFSIGNALED(status):
        rc = -os.WTERMSIG(status)
    else:
        rc = os.WEXITSTATUS(status)
    try:
        os.write(status_w, struct.pack("i", rc))
    finally:
        os._exit(0)


def _wait(pid: int, life_fd: int) -> int:
    """The worker's wait status; kills it first if the deciding process goes away (its lifeline closes)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    while True:
        ready, _, _ = select.select([life_fd] + ([pidfd] if pidfd is not None else []), [], [],
                                   None if pidfd is not None else 0.2)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if life_fd in ready:  # EOF: the deciding process is gone
            os.kill(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1]


def main(sock_fd: int, life_fd: int) -> None:
    # Ends when the deciding process closes its end of the socket (or dies): no PR_SET_PDEATHSIG, which
    # would fire when the *thread* that started it ends. Its workers watch the deciding process's lifeline.
    sock = socket.socket(fileno=sock_fd)
    driver, culprit = _preload()
    _ZYGOTE_PATHS.update(TMPDIR=os.environ.get("TMPDIR", ""), HOME=os.environ.get("HOME", ""), cwd=os.getcwd())
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # keepers are reaped by the kernel
    sock.send(json.dumps({"ready": True, "pid": os.getpid(), "cuda_driver": driver, "cuda_driver_by": culprit}).encode())
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 16)
        except OSError:
            break
        if not msg:
            break  # the deciding process closed its end
        try:
            req = json.loads(msg)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
        except Exception as e:  # noqa: BLE001 - a bad request, or no fork: the caller starts one the old way
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
            continue
        if pid == 0:
            sock.close()
            _keeper(req, fds, life_fd)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())
    _remove_own_folder()


def _remove_own_folder() -> None:
    """The deciding process is gone or let this zygote go: its folder (HOME, TMPDIR, log) goes too, or a
    killed deciding process leaves it behind. A deciding process that closes a zygote removes it itself."""
    own = Path(_ZYGOTE_PATHS.get("cwd") or "")
    if own.name.startswith("tilesmith-zygote-"):
        shutil.rmtree(own, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
