"""The client OpenEnv's `AutoEnv` imports: `<module>.client.<Name>Env`, with the action and observation classes the
manifest names beside it."""

from drkernel.integrations.openenv import KernelAction, KernelEnvClient, KernelObservation, KernelState

DrkernelEnv = KernelEnvClient  # OpenEnv derives the client's name from the environment's: drkernel_env -> DrkernelEnv

__all__ = ["DrkernelEnv", "KernelAction", "KernelObservation", "KernelState"]
