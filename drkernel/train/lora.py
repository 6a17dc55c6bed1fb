"""LoRA for the SFT and RL runs (`lora_rank` in SFTRunConfig and TrainConfig): only adapters train, so what a run
saves is an adapter of a few MB over its base instead of the whole model, small enough to bring back from a GPU
machine and carry to the next one (docs/experiments.md); `hf:ADAPTER` loads it merged into its base."""

from __future__ import annotations

from typing import Any

from drkernel.tasks.loaders import require


def lora_config(rank: int, alpha: int = 0) -> Any | None:
    """PEFT's LoRA on every linear layer but the output head (`all-linear`), alpha twice the rank unless given;
    None for rank 0 (all weights train)."""
    if rank <= 0:
        return None
    peft = require("peft", "train", "LoRA training")
    return peft.LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, target_modules="all-linear", task_type="CAUSAL_LM")
