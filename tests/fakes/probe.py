"""`python -m tests.fakes.probe ACTION...`: what a started worker sees, as one JSON line (tests/test_forked.py)."""

import errno
import json
import os
import random
import socket
import sys
import tempfile
import time


def _fds():
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        if not target.startswith("/proc/"):
            out[int(name)] = target
    return out


def main(argv):
    action = argv[0] if argv else "report"
    if action == "exit":
        sys.exit(int(argv[1]))
    if action == "raise":
        raise RuntimeError("the probe raised on purpose")
    if action == "cuda":  # a context of its own, a kernel, a CUDA graph
        import torch

        x = torch.arange(4.0, device="cuda")
        g = torch.cuda.CUDAGraph()
        y = x * 2  # warm-up outside the capture
        with torch.cuda.graph(g):
            y = x * 2
        g.replay()
        print(json.dumps({"sum": float(y.sum()), "device": torch.cuda.get_device_name()}), flush=True)
        return
    if action == "detach":  # leaves the process group and clears PR_SET_PDEATHSIG, then beats until killed
        import ctypes

        ctypes.CDLL(None).prctl(1, 0)
        os.setsid()
        print(json.dumps({"pid": os.getpid()}), flush=True)
        for _ in range(1200):
            with open("beat", "w") as f:
                f.write(str(time.monotonic_ns()))
            time.sleep(0.05)
        return
    if action == "escape":  # escape MARKER OUTSIDE HIDDEN...: root in its user namespace, undo the sandbox's view
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        marker, outside, hidden = argv[1], argv[2], argv[3:]
        got = {}
        for path in hidden:  # unmount what hides them
            got["umount " + path] = libc.umount2(path.encode(), 2) == 0  # MNT_DETACH
        got["sees marker"] = os.path.exists(marker)  # a file the parent made in a hidden folder
        for path in ("/", os.path.dirname(outside)):  # MS_REMOUNT | MS_BIND: read-write again
            got["remount " + path] = libc.mount(None, path.encode(), None, ctypes.c_ulong(32 | 4096), None) == 0
        try:
            with open(outside, "w") as f:
                f.write("escaped")
            got["wrote"] = True
        except OSError:
            got["wrote"] = False
        print(json.dumps(got), flush=True)
        return
    if action == "kernel_controls":  # opened for writing and closed at once: nothing is ever written
        out = {}
        for path in ("/proc/sysrq-trigger", "/proc/sys/kernel/core_pattern", "/sys/kernel/uevent_helper"):
            try:
                os.close(os.open(path, os.O_WRONLY))
                out[path] = "opened"
            except OSError as e:
                out[path] = errno.errorcode.get(e.errno, str(e.errno))
        out["sys_read_only"] = bool(os.statvfs("/sys").f_flag & os.ST_RDONLY)
        import stat

        out["block_devices"] = sorted(n for n in os.listdir("/dev") if stat.S_ISBLK(os.stat("/dev/" + n).st_mode))
        with open("/dev/null", "wb") as f:
            f.write(b"x")
        with open("/dev/urandom", "rb") as f:
            out["urandom"] = len(f.read(16))
        print(json.dumps(out), flush=True)
        return
    if action == "ipc":  # ipc KEY: a System V shared-memory segment made and left behind, and the host name changed
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        shmid = libc.shmget(int(argv[1]), 4096, 0o1000 | 0o600)  # IPC_CREAT
        renamed = libc.sethostname(b"candidate", 9) == 0
        print(json.dumps({"shmid": shmid, "renamed": renamed, "hostname": os.uname().nodename}), flush=True)
        return
    if action == "sleep":
        print(json.dumps({"pid": os.getpid()}), flush=True)
        time.sleep(600)
    import torch
    import torch._inductor.codecache as codecache
    from torch._inductor import config

    try:
        socket.create_connection(("1.1.1.1", 53), timeout=2).close()
        net = "reached"
    except OSError as e:
        net = type(e).__name__
    print(json.dumps({"pid": os.getpid(), "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
                      "fds": sorted(_fds()), "env": dict(os.environ), "cwd": os.getcwd(), "argv": sys.argv[1:],
                      "path0": sys.path[0], "tmp": tempfile.gettempdir(), "random": random.random(),
                      "threads": torch.get_num_threads(), "net": net, "header_dir": codecache._HEADER_DIR,
                      "inductor_config": {k: repr(v) for k, v in sorted(config.get_config_copy().items())},
                      "initial_env": open("/proc/self/environ", "rb").read().decode(errors="replace")}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
