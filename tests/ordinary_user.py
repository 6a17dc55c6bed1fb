"""Run a command as an ordinary (non-root) user, from a test that runs as root: how drkernel's users run it.

    python tests/ordinary_user.py UID HOME [--no-user-namespaces] -- COMMAND...

Started as root, it gives itself a private mount namespace where every folder the Python installation and this
repository lie under is searchable (a Python or a checkout under root's 0700 home is a common CI layout: there a
tmpfs with only those bound into it stands in for the home), makes HOME, drops to UID (no capabilities, no groups), and
execs COMMAND. With --no-user-namespaces it first installs a system-call filter that refuses new user namespaces,
as a container's default seccomp profile or `sysctl user.max_user_namespaces=0` would.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH = 0x1000, 1 << 14, 1 << 18, 2

_libc = ctypes.CDLL(None, use_errno=True)


def command(uid: int, home: Path, argv: list[str], user_namespaces: bool = True) -> list[str]:
    """The command line that runs `argv` as `uid`."""
    flags = [] if user_namespaces else ["--no-user-namespaces"]
    return [sys.executable, str(Path(__file__).resolve()), str(uid), str(home), *flags, "--", *argv]


def _check(value: int, what: str) -> None:
    if value != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def _blocked_folders(paths: list[str]) -> dict[str, list[str]]:
    """For each folder that others cannot search, the paths below it that must stay reachable."""
    blocked: dict[str, list[str]] = {}
    reals = sorted({os.path.realpath(p) for p in paths})
    for real in [r for r in reals if not any(r.startswith(o + os.sep) for o in reals)]:
        parts = Path(real).parents
        for folder in sorted(parts, key=lambda p: len(p.parts)):
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                blocked.setdefault(str(folder), []).append(real)
                break
    return blocked


def _expose(paths: list[str]) -> None:
    """In a private mount namespace, replace each unsearchable folder by a tmpfs holding only `paths` below it."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    for folder, inside in _blocked_folders(paths).items():
        stash = []
        for index, path in enumerate(inside):
            holder = f"/tmp/.drkernel-ordinary-user-{os.getpid()}-{index}"
            os.makedirs(holder, exist_ok=True)
            _check(_libc.mount(path.encode(), holder.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
            stash.append((holder, path))
        _check(_libc.mount(b"tmpfs", folder.encode(), b"tmpfs", 0, b"mode=0755"), f"tmpfs on {folder}")
        for holder, path in stash:
            os.makedirs(path, exist_ok=True)
            _check(_libc.mount(holder.encode(), path.encode(), None, MS_BIND | MS_REC, None), f"bind back {path}")
            _check(_libc.umount2(holder.encode(), MNT_DETACH), f"umount {holder}")
            os.rmdir(holder)


def _refuse_user_namespaces() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from drkernel.sandbox import seccomp

    seccomp.install([seccomp.Rule("unshare", argument=0, mask=CLONE_NEWUSER),
                     seccomp.Rule("clone", argument=0, mask=CLONE_NEWUSER),
                     seccomp.Rule("clone3", error=errno.ENOSYS)])


def main(args: list[str]) -> None:
    split = args.index("--")
    uid, home, options, argv = int(args[0]), Path(args[1]), args[2:split], args[split + 1:]
    _expose([sys.base_prefix, sys.prefix, sys.exec_prefix, str(Path(__file__).resolve().parents[1])])
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, uid, uid)
    os.chmod(home, 0o700)
    if "--no-user-namespaces" in options:
        _refuse_user_namespaces()
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    os.chdir(home)
    env = {**os.environ, "HOME": str(home), "USER": f"uid{uid}", "LOGNAME": f"uid{uid}"}
    os.execvpe(argv[0], argv, env)


if __name__ == "__main__":
    main(sys.argv[1:])
