"""A tiny policy built locally: a byte-level BPE tokenizer trained on given texts and a randomly initialised model.

Tests, CPU examples and the miniature reproduction need a causal LM with a chat template and no download; a model
of a few hundred thousand parameters trains at seconds a step on a CPU.
Run as a script: `python -m drkernel.train.policy OUT_DIR TEXT_FILE... [--arch qwen2] [--hidden 64] ...`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from drkernel.tasks.loaders import require

# ChatML, as Qwen models use: the special tokens below delimit the turns, `add_generation_prompt` opens the
# assistant's turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ARCHITECTURES = ("qwen2", "qwen3", "llama")


@dataclass(frozen=True)
class PolicyShape:
    """Size of the random model; the defaults give about 75 k parameters besides the (vocab x 64) embeddings."""

    arch: str = "qwen2"
    vocab_size: int = 2048
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 8192
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"arch must be one of {ARCHITECTURES}, not {self.arch!r}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError("hidden_size must be a multiple of num_heads, and num_heads of num_kv_heads")
        if self.vocab_size < 300:
            raise ValueError(f"vocab_size must be at least 300 (256 bytes and the special tokens), not {self.vocab_size}")


def _train_tokenizer(texts: Iterable[str], vocab_size: int):
    tokenizers = require("tokenizers", "train", "Building a tiny policy")
    transformers = require("transformers", "train", "Building a tiny policy")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),  # every byte encodes: no unknown token
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
    )


def _model_config(shape: PolicyShape, tokenizer):
    transformers = require("transformers", "train", "Building a tiny policy")
    config_class = {
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "llama": transformers.LlamaConfig,
    }[shape.arch]
    return config_class(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


def build_policy(out_dir: str | Path, texts: Iterable[str], shape: PolicyShape = PolicyShape()) -> Path:
    """Write a tokenizer trained on `texts` and a random model of `shape` to `out_dir`; loadable with
    `AutoTokenizer` / `AutoModelForCausalLM.from_pretrained(out_dir)`. Same texts and shape give the same weights.
    """
    torch = require("torch", "train", "Building a tiny policy")
    transformers = require("transformers", "train", "Building a tiny policy")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(texts, shape.vocab_size)
    torch.manual_seed(shape.seed)
    model = transformers.AutoModelForCausalLM.from_config(_model_config(shape, tokenizer))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    (out / "policy_shape.json").write_text(json.dumps(asdict(shape), indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("texts", nargs="+", type=Path, help="text files (e.g. task sources) to train the tokenizer on")
    defaults = PolicyShape()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args(argv)
    texts = [p.read_text() for p in args.texts]
    shape = PolicyShape(**{name: getattr(args, name) for name in asdict(defaults)})
    print(build_policy(args.out_dir, texts, shape))


if __name__ == "__main__":
    main()
