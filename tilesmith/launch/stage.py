"""The sandbox's second stage (see sandbox.py), run by `unshare` in new user, mount, PID and
network namespaces: `python -S -I stage.py SPEC_JSON -- ARGV`. Standard library only, and run
as a script, so it starts in milliseconds and imports nothing from the (writable) project.

This process stays outside the new PID namespace (unshare without --fork): it dies with the process
that started it and forks ARGV's process, the namespace's first process, which sets up the file system
and execs ARGV. When that process ends, the kernel kills everything left in the namespace.
"""

import ctypes
import json
import os
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
_OPT_FLAGS = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
              "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
CLONE_NEWIPC, CLONE_NEWUTS = 0x08000000, 0x04000000
_SKIP = ("/proc", "/sys", "/dev")  # kernel file systems: /dev keeps the GPU's device nodes usable
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(src, dst, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    if _libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {fstype or ''} {src} -> {dst}: {os.strerror(e)}")


def _die_with_parent():
    _libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def _under(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _overlay(cache, i, scratch):
    """A private writable layer over a shared cache: reads hit the cache, writes land in scratch."""
    base = os.path.join(scratch, ".sandbox", f"cache{i}")
    dirs = [os.path.join(base, d) for d in ("upper", "work", "merged")]
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    _mount("overlay", dirs[2], "overlay", 0, f"lowerdir={cache},upperdir={dirs[0]},workdir={dirs[1]}")
    return dirs[2]


def _setup(spec, cwd):
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this namespace's processes only
    _kernel_controls_read_only()
    scratch = spec["scratch"]
    keep = []  # (path, fd, writable): opened before anything is hidden, bound back afterwards
    for p in spec["readable"]:
        if os.path.exists(p):
            keep.append((p, os.open(p, os.O_PATH), False))
    for i, c in enumerate(spec["caches"]):
        if os.path.isdir(c):
            keep.append((c, os.open(_overlay(c, i, scratch), os.O_PATH), True))
    for p in spec["writable"] + [scratch]:
        if os.path.isdir(p):
            keep.append((p, os.open(p, os.O_PATH), True))
    if spec.get("devices") == "basic":
        _basic_dev()
    for h in sorted(spec["hidden"], key=len):
        if os.path.isdir(h) and not os.path.islink(h):
            _mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=64m")
    for path, fd, _ in keep:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(path, exist_ok=True)
        elif not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "a").close()
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
    rw = [p for p, _, w in keep if w]
    private_tmp = [h for h in spec["hidden"] if h in (spec.get("private_tmp") or [])]
    _read_only(set(rw), private_tmp)
    os.chdir(cwd)  # through the new mounts: the old working directory handle sits on a read-only mount
    _lock()


def _lock():
    """Seal the view built above: this process is root in the sandbox's user namespace, which owns the
    mount namespace, so the command it runs could unmount the file systems that hide the home and temp
    folders, or remount / read-write, and reach everything they hide. In a user namespace nested in it,
    with a mount namespace of its own, every mount is copied locked (MNT_LOCKED): none can be unmounted
    or moved, and none made writable again."""
    enter_user_namespace(CLONE_NEWNS)


def enter_user_namespace(flags: int) -> None:
    """unshare(CLONE_NEWUSER | flags) and map root in it to this process's uid and gid: what `unshare
    --user --map-root-user` does to its own process (also the zygote's keeper, zygote.py)."""
    uid, gid = os.geteuid(), os.getegid()
    if _libc.unshare(ctypes.c_int(CLONE_NEWUSER | flags)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"unshare: {os.strerror(e)}")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


_BASIC_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def _basic_dev():
    """A /dev of the sandbox's own: the basic character devices bound from the machine's, /dev/shm (made
    private below), the /dev/fd links. Run by the real root, the machine's /dev would let the command open
    block devices (loop, zram) for writing."""
    fds = [(n, os.open("/dev/" + n, os.O_PATH)) for n in _BASIC_DEVICES if os.path.exists("/dev/" + n)]
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=1m")
    for name, fd in fds:
        open("/dev/" + name, "a").close()
        _mount(f"/proc/self/fd/{fd}", "/dev/" + name, None, MS_BIND)
        os.close(fd)
    os.makedirs("/dev/shm", exist_ok=True)
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, "/dev/" + link)


# Kernel controls a fresh /proc and /sys expose. The sandbox's root is the caller's uid outside: run by
# the real root (containers, many GPU hosts), file permissions alone would let the command write
# /proc/sysrq-trigger (reboot the host) and the like. Read-only, as container runtimes make them.
_PROC_READ_ONLY = ("/proc/sysrq-trigger", "/proc/sys", "/proc/irq", "/proc/bus", "/proc/fs")


def _kernel_controls_read_only():
    for p in _PROC_READ_ONLY:
        if os.path.exists(p):
            _mount(p, p, None, MS_BIND | MS_REC)
            _mount(None, p, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    try:  # /sys itself (its own mounts below it, cgroups and the like, keep their flags)
        with open("/proc/self/mountinfo") as f:
            row = next((line.split() for line in f if line.split()[4] == "/sys"), None)
        if row is not None:
            _remount_read_only("/sys", row[5])
    except OSError:
        pass  # a /sys this namespace may not remount: its files stay as the caller's uid may use them


def _remount_read_only(mp, opts):
    """Remount mount point `mp` read-only, keeping the flags its mountinfo options say it has."""
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    for opt in opts.split(","):
        flags |= _OPT_FLAGS.get(opt, 0) & ~MS_RDONLY
    _mount(None, mp, None, flags)


def _read_only(rw, private_tmp):
    seen = set()
    with open("/proc/self/mountinfo") as f:
        rows = [line.split() for line in f]
    for row in reversed(rows):  # top of each stack first; a path is remounted once
        mp = row[4].replace("\\040", " ")
        if mp in seen or mp in rw or mp in private_tmp or _under(mp, _SKIP):
            seen.add(mp)
            continue
        seen.add(mp)
        try:
            _remount_read_only(mp, row[5])
        except OSError as e:
            if os.path.exists(mp):  # a mount we cannot make read-only: refuse to run the command
                raise
            del e


def main(argv):
    spec = json.loads(argv[1])
    cmd = argv[argv.index("--") + 1:]
    cwd = os.getcwd()
    # When the process that started it goes, this process kills its child (and so the whole PID namespace)
    # before it ends: the child's own PR_SET_PDEATHSIG is no guarantee, the command can clear it.
    child = []

    def _gone(*_):
        for c in child:
            os.kill(c, signal.SIGKILL)
        os._exit(128 + signal.SIGKILL)

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGTERM, _gone)
    _libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            _die_with_parent()
            _setup(spec, cwd)
            os.execvp(cmd[0], cmd)
        except BaseException as e:
            sys.stderr.write(f"tilesmith sandbox: {e}\n")
            os._exit(97)
    child.append(pid)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # a SIGTERM sent meanwhile is handled now
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sys.exit(128 + os.WTERMSIG(status))
    sys.exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main(sys.argv)
