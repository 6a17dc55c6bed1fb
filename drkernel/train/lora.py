"""LoRA for the SFT and RL runs (`lora_rank` in SFTRunConfig and TrainConfig): only adapters train, so what a run
saves is an adapter of a few MB over its base instead of the whole model, small enough to copy from one GPU
machine to the next (docs/miniature.md); `hf:ADAPTER` loads it merged into its base."""

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


def merged_weights(model: Any) -> dict[str, Any]:
    """The weights of a plain model of `model`'s architecture: for a PEFT model, each LoRA layer's base weight plus
    its active adapters' deltas, under the base model's own names; other models' state as it is. Nothing of `model`
    changes (PEFT's merge_adapter adds the deltas in place and subtracts them again, which drifts the base)."""
    peft = require("peft", "train", "LoRA training")
    if not isinstance(model, peft.PeftModel):
        return dict(model.state_dict())
    inner = model.get_base_model()
    layers = {name: module for name, module in inner.named_modules() if isinstance(module, peft.tuners.lora.LoraLayer)}
    weights = {}
    for name, tensor in inner.state_dict().items():
        owner, found, rest = name.partition(".base_layer.")
        if found:
            layer = layers[owner]
            if rest == "weight":
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A:
                        tensor = tensor + layer.get_delta_weight(adapter)
            weights[f"{owner}.{rest}"] = tensor
        elif ".lora_" not in name:
            weights[name] = tensor
    return weights
