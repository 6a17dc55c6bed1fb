"""drkernel's OpenEnv environment as OpenEnv's tools find environments: the `openenv-drkernel_env` distribution,
its module `drkernel_env` (this folder), the manifest beside it and the client `drkernel_env.client.DrkernelEnv`.
Everything is drkernel's (drkernel.integrations.openenv); this package only names it the OpenEnv way."""

from drkernel_env.client import DrkernelEnv, KernelAction, KernelObservation, KernelState

__all__ = ["DrkernelEnv", "KernelAction", "KernelObservation", "KernelState"]
