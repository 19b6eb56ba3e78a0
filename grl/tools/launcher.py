"""The sandbox's launcher: a trusted, single-threaded process between GRL and the tool's code.

GRL starts it as `python -I -S launcher.py` in a new session (grl/tools/sandbox.py) and writes one
JSON line of settings and then the code to its stdin. It runs no code of the model: it builds the
walls and starts the child that does. It imports nothing of grl, so it runs the same from any
working directory. Done here and not in a `preexec_fn` because GRL's rollout is multi-threaded and
forking a multi-threaded process into Python code can deadlock.

1. New namespaces: mount and PID always, network unless the user opted out; as a non-root user also
   a user namespace (uid mapped to itself) so the rest works without privileges.
2. Mounts: every mount becomes private (nothing propagates to the host) and read-only; the working
   folder is a fresh tmpfs of `max_dir_mb` owned by the sandbox uid, the one writable place.
3. Fork: the child is PID 1 of the new PID namespace, so when it ends, or is killed, the kernel kills
   and reaps every process the code started, wherever it moved its session or process group.
4. The child mounts its own /proc (it sees only its namespace), writes the code to main.py, sets
   the rlimits, drops to the sandbox uid (root only: RLIMIT_NPROC does not apply to root), asks for
   SIGKILL if the launcher dies, and execs the interpreter with an empty environment.
5. The launcher writes "pid N" (the child's host pid, so GRL can kill it) and then "exit N" or
   "signal N" on the status pipe (its fd number is in the settings), which the code never holds.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 0x400, 0x800, 0x200000
PR_SET_PDEATHSIG = 1
# Mount options a read-only remount must keep: the kernel refuses to clear locked ones.
KEPT_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)}")


def _encoded(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _mount(source, target, fstype, flags, data, what):
    _check(
        libc.mount(
            _encoded(source), _encoded(target), _encoded(fstype), ctypes.c_ulong(flags), _encoded(data)
        ),
        what,
    )


def _status(settings: dict, line: str) -> None:
    os.write(settings["status_fd"], (line + "\n").encode())


def _unshare(settings: dict) -> None:
    flags = CLONE_NEWNS | CLONE_NEWPID | (CLONE_NEWNET if settings["isolate_network"] else 0)
    uid, gid = os.getuid(), os.getgid()
    if uid != 0:
        flags |= CLONE_NEWUSER
    _check(libc.unshare(flags), "unshare (namespaces)")
    if uid != 0:  # map the user to itself: the namespace's capabilities serve the mounts below only
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")


def _mount_points() -> list[tuple[str, str]]:
    """(mount point, its per-mount options) of every mount, deepest last."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")
            points.append((point, fields[5]))
    return points


def _expose(paths: list[str]) -> None:
    """Make the interpreter's folders reachable by the sandbox uid where a parent that others may
    not enter hides them (a pyenv or conda under /root): a tmpfs covers that parent in this
    namespace only, and the folders are bound back at their own paths."""
    covered: dict[str, list[tuple[str, int]]] = {}
    for path in paths:
        parts = path.strip("/").split("/")
        ancestors = ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]
        blocked = next((a for a in ancestors if not os.stat(a).st_mode & 0o001), None)
        if blocked is not None:
            covered.setdefault(blocked, []).append((path, os.open(path, os.O_PATH)))
    for parent, inside in covered.items():
        _mount("tmpfs", parent, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755", f"cover {parent}")
        for path, fd in inside:
            os.makedirs(path, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None, f"expose {path}")
            os.close(fd)


def _walls(settings: dict) -> None:
    workdir, uid = settings["workdir"], settings["uid"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None, "make mounts private")
    if os.getuid() == 0:
        _expose(settings["python_dirs"])
    for point, options in _mount_points():
        if point == "/proc" or point.startswith("/proc/"):
            continue  # replaced by the child's own /proc
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for option in options.split(","):
            flags |= KEPT_FLAGS.get(option, 0)
        if libc.mount(
            None, point.encode(), None, ctypes.c_ulong(flags), None
        ) != 0 and "ro" not in options.split(","):
            raise SetupError(f"read-only remount of {point}: {os.strerror(ctypes.get_errno())}")
    owner = "" if os.getuid() != 0 else f",uid={uid},gid={uid}"
    _mount(
        "tmpfs",
        workdir,
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={settings['max_dir_mb']}m,mode=0700{owner}",
        "mount the working folder",
    )


def _child(settings: dict, code: bytes) -> None:
    """PID 1 of the sandbox: finish the walls, then become the tool's interpreter."""
    limits = settings["limits"]
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None, "mount /proc")
    os.chdir(settings["workdir"])
    with open("main.py", "wb") as f:
        f.write(code)
    uid = settings["uid"]
    if os.getuid() == 0:
        os.chown("main.py", uid, uid)
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.close(settings["status_fd"])
    for name, value in (
        ("RLIMIT_CPU", limits["cpu_s"]),
        ("RLIMIT_AS", limits["memory_mb"] << 20),
        ("RLIMIT_NPROC", limits["max_processes"]),
        ("RLIMIT_FSIZE", limits["max_file_mb"] << 20),
        ("RLIMIT_NOFILE", limits["max_open_files"]),
        ("RLIMIT_CORE", 0),
    ):
        hard = value + 1 if name == "RLIMIT_CPU" else value  # SIGXCPU at the soft limit, SIGKILL a second on
        resource.setrlimit(getattr(resource, name), (value, hard))
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    # After the uid change, which clears it; the code may clear it again, but PID 1 dies with its namespace.
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": settings["workdir"],
        "TMPDIR": settings["workdir"],
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    os.execve(settings["python"], [settings["python"], "-I", "main.py"], env)


def main() -> None:
    settings = json.loads(sys.stdin.buffer.readline())
    code = sys.stdin.buffer.read()
    try:
        _unshare(settings)
        _walls(settings)
    except (SetupError, OSError) as err:
        _status(settings, f"setup {err}")
        sys.exit(125)
    pid = os.fork()
    if pid == 0:
        try:
            _child(settings, code)
        except BaseException as err:  # noqa: BLE001 - any failure before exec is a setup failure
            os.write(2, f"sandbox setup failed: {err}\n".encode())
        os._exit(125)
    _status(settings, f"pid {pid}")
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        _status(settings, f"signal {os.WTERMSIG(status)}")
    else:
        _status(settings, f"exit {os.WEXITSTATUS(status)}")
    os._exit(0)  # no interpreter teardown: GRL is waiting


if __name__ == "__main__":
    main()
