"""Which confinement layers evaluations get on this machine, asked before anything runs (`drkernel doctor`, and the
one-line warning of `eval` and `serve`): a missing layer never fails an evaluation, but its user should know.

Each layer is tried as an evaluation would try it, in a throwaway child process, so that the caller's own namespaces
and privileges stay as they are.
"""

from __future__ import annotations

import ctypes
import json
import os
from dataclasses import asdict, dataclass

from drkernel.sandbox import confine, landlock, seccomp


@dataclass(frozen=True)
class Layer:
    name: str
    active: bool
    detail: str  # how it is provided, or why it is missing
    protects: str
    fix: str = ""  # what would make it active, where it is missing


def check_layers() -> list[Layer]:
    """Every layer, active or missing with the reason and the fix."""
    namespaces = _in_child(_namespace_probe)
    way, refusal = namespaces.get("way", ""), namespaces.get("reason", "the probe failed")
    reason = refusal.split("; fix: ", 1)[0]
    own = "private PID and mount namespaces, their own /proc"
    layers = [
        Layer("pid_namespace", bool(way), {"root": f"{own} (as root)", "user": f"{own} (in a user namespace)"}.get(
            way, reason), "the user's other processes, their environments and command lines; signals to them",
            "" if way else _fix(refusal)),
        Layer("network_namespace", bool(namespaces.get("network")), namespaces.get("network") or namespaces.get(
            "network_reason", reason), "the network, a port on 127.0.0.1 included",
            "" if namespaces.get("network") else _fix(refusal)),
    ]
    abi = landlock.abi_version()
    layers.append(Layer("landlock", abi >= 1, f"ABI {abi}" if abi else "this kernel has no Landlock",
                        "files outside the evaluation's folder (the home directory, keys, tokens, .env files); "
                        "TCP (ABI 4+); signals out of the sandbox (ABI 6+)",
                        "" if abi else "Linux 5.13 or newer with 'landlock' in the lsm= boot parameter"))
    refused = seccomp.supported()
    layers.append(Layer("seccomp", not refused, refused or "a system-call filter for the candidate's process",
                        "tracing other processes, new namespaces, performance counters, io_uring; the channel to the "
                        "judge (the candidate's threads cannot touch it)",
                        "a kernel with CONFIG_SECCOMP_FILTER" if refused else ""))
    return layers


def missing_warning(layers: list[Layer]) -> str | None:
    """One line naming the missing layers, or None when every layer is active."""
    missing = [layer.name for layer in layers if not layer.active]
    if not missing:
        return None
    return (f"drkernel: confinement incomplete on this machine ({', '.join(missing)} missing): evaluations run, but "
            "candidates can reach more; `drkernel doctor` says why and how to fix it")


def as_json(layers: list[Layer]) -> list[dict[str, object]]:
    return [asdict(layer) for layer in layers]


def _namespace_probe() -> dict[str, str]:
    if confine.new_pid_namespace():  # this child's next child would be PID 1: try the mount there
        pid = os.fork()
        if pid == 0:
            try:
                confine.mount_private_proc()
                os._exit(0)
            except OSError:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        if status == 0:
            network = _libc.unshare(confine.CLONE_NEWNET) == 0
            return {"way": "root", "network": "private, empty (as root)" if network else "",
                    "network_reason": "unshare(CLONE_NEWNET) refused"}
    refusal = confine.user_namespaces_refused()
    if not refusal:
        return {"way": "user", "network": "private, empty (in a user namespace)"}
    return {"way": "", "reason": refusal}


def _fix(reason: str) -> str:
    return reason.split("; fix: ", 1)[1] if "; fix: " in reason else ""


def _in_child(probe: object) -> dict[str, str]:
    """`probe()` in a forked child; its answer comes back as JSON on a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            answer = probe()  # type: ignore[operator]
        except BaseException as exc:
            answer = {"way": "", "reason": f"the probe failed: {exc!r}"}
        os.write(write, json.dumps(answer).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    try:
        return json.loads(data)
    except ValueError:
        return {"way": "", "reason": "the probe failed"}


_libc = ctypes.CDLL(None, use_errno=True)
