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
    try:
        namespaces = json.loads(confine.answer_of_child(lambda: json.dumps(_namespace_probe())))
    except ValueError:
        namespaces = {}
    way, refusal = namespaces.get("way", ""), namespaces.get("reason", "the probe failed")
    reason = refusal.split("; fix: ", 1)[0]
    how = {confine.ROOT_NAMESPACE: "as root", confine.USER_NAMESPACE: "in a user namespace"}
    network = namespaces.get("network", "")
    layers = [
        Layer("pid_namespace", bool(way),
              f"private PID and mount namespaces, their own /proc ({how[way]})" if way else reason,
              "the user's other processes, their environments and command lines; signals to them",
              "" if way else _fix(refusal)),
        Layer("network_namespace", bool(network), network or namespaces.get("network_reason", reason),
              "the network, a port on 127.0.0.1 included", "" if network else _fix(refusal)),
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
    own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    way, reason = confine.namespace_way(own)
    if way == confine.USER_NAMESPACE:
        return {"way": way, "network": "private, empty (in a user namespace)"}
    if way == confine.ROOT_NAMESPACE:
        network = _libc.unshare(confine.CLONE_NEWNET) == 0
        return {"way": way, "network": "private, empty (as root)" if network else "",
                "network_reason": "unshare(CLONE_NEWNET) refused"}
    return {"way": "", "reason": reason}


def _fix(reason: str) -> str:
    return reason.split("; fix: ", 1)[1] if "; fix: " in reason else ""


_libc = ctypes.CDLL(None, use_errno=True)
