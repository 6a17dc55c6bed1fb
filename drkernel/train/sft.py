"""Cold-start SFT of the miniature reproduction: a policy built here (drkernel.train.policy), trained with TRL's
SFTTrainer on the conversational mix of drkernel.train.synthetic_sft, saved in files small enough to copy between machines.

Each row `{"messages": [...]}` becomes a prompt (every message but the last) and a completion (the last answer), so
the loss falls on the final assistant answer only: the user prompts and feedback are context, and the wrong first
answer of a two-turn row is not taught. The tokenizer is trained on the rows' texts, the model initialised from the
seed, the data order seeded, so a rerun on the same machine rebuilds the same policy.

Run as a script: `python -m drkernel.train.sft --data sft.jsonl --out DIR [--hidden-size 512 ...] [--epochs 3]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from drkernel.agent.local_models import load_causal_lm, load_tokenizer
from drkernel.tasks.loaders import require
from drkernel.train.lora import lora_config
from drkernel.train.policy import PolicyShape, build_policy
from drkernel.train.run_record import write_run_record

POLICY_DIR = "policy"  # the random policy before SFT (tokenizer trained on the data)
FINAL_DIR = "final"  # the SFT policy, in bf16, in shards of at most max_shard_size
SUMMARY = "sft_summary.json"
IGNORED = -100  # the label of a token without loss (the prompt's)


@dataclass
class SFTRunConfig:
    """What one SFT run needs. The defaults are the GPU size of the miniature reproduction (about 21 M parameters,
    42 MB in bf16); tests shrink `policy` and set `use_cpu` and `max_steps`."""

    data: str  # a JSONL of {"messages": [...]} rows
    output_dir: str
    policy: PolicyShape = field(default_factory=lambda: PolicyShape(
        vocab_size=8192, hidden_size=512, intermediate_size=1408, num_layers=6, num_heads=8, num_kv_heads=2))
    policy_path: str | None = None  # start from this policy (a saved folder or a GGUF) instead of building one
    epochs: float = 3.0
    max_steps: int = -1  # when positive, overrides epochs
    learning_rate: float = 1e-3  # a model trained from scratch, not a pretrained one
    warmup_ratio: float = 0.05
    per_device_train_batch_size: int = 16
    gradient_accumulation_steps: int = 1
    max_length: int = 4096  # tokens of prompt and answer; longer rows are cut at the end
    bf16: bool = False  # mixed precision (the weights stay float32 while training)
    use_cpu: bool = False
    seed: int = 0
    logging_steps: int = 10
    max_shard_size: str = "15MB"  # saved files of at most 15 MB, easy to move between machines
    lora_rank: int = 0  # > 0: train a LoRA adapter (drkernel.train.lora) and save it, not the whole model, as final/
    lora_alpha: int = 0  # 0: twice the rank
    # transformers' full determinism (deterministic torch algorithms, cuBLAS workspace, blocking launches): without it
    # the same rows and seed gave three different SFT policies on three GPU machines, two of them H100s
    # (docs/miniature.md), so an adapter trained over one does not sit on the same weights later
    full_determinism: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.policy, dict):
            self.policy = PolicyShape(**self.policy)
        if self.epochs <= 0 and self.max_steps <= 0:
            raise ValueError("need a positive epochs or max_steps")
        if self.learning_rate <= 0 or self.per_device_train_batch_size < 1 or self.max_length < 16:
            raise ValueError("learning_rate must be positive, per_device_train_batch_size at least 1, "
                             "max_length at least 16")


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The SFT rows as prompt/completion pairs; a row that is not a chat ending with an assistant answer is an
    error naming its line."""
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            messages = json.loads(line)["messages"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a {{\"messages\": [...]}} row ({exc})") from exc
        if len(messages) < 2 or messages[-1].get("role") != "assistant" or messages[0].get("role") != "user":
            raise ValueError(f"{path}:{number}: a row must start with a user message and end with an assistant answer")
        rows.append({"prompt": messages[:-1], "completion": messages[-1:]})
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def policy_texts(rows: list[dict[str, Any]]) -> list[str]:
    """What the tokenizer is trained on: every message of every row."""
    return [message["content"] for row in rows for message in row["prompt"] + row["completion"]]


def sft_config(config: SFTRunConfig) -> Any:
    trl = require("trl", "train", "Cold-start SFT")
    return trl.SFTConfig(
        output_dir=config.output_dir,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        learning_rate=config.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=config.warmup_ratio,  # a float below 1 is a share of the steps
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        max_length=config.max_length,
        completion_only_loss=True,
        bf16=config.bf16,
        use_cpu=config.use_cpu,
        seed=config.seed,
        data_seed=config.seed,
        full_determinism=config.full_determinism,
        logging_steps=config.logging_steps,
        save_strategy="no",
        report_to=["none"],
    )


def sft_trainer(config: SFTRunConfig, rows: list[dict[str, Any]], policy_path: str | Path) -> Any:
    """TRL's SFTTrainer over the rows (tokenized on construction, labels IGNORED outside each final answer) with
    the policy's weights in float32."""
    torch = require("torch", "train", "Cold-start SFT")
    trl = require("trl", "train", "Cold-start SFT")
    datasets = require("datasets", "train", "Cold-start SFT")
    tokenizer = load_tokenizer(str(policy_path))
    model = load_causal_lm(str(policy_path), dtype=torch.float32)
    return trl.SFTTrainer(model=model, args=sft_config(config), train_dataset=datasets.Dataset.from_list(rows),
                          processing_class=tokenizer, peft_config=lora_config(config.lora_rank, config.lora_alpha))


def run_sft(config: SFTRunConfig) -> dict[str, Any]:
    """Build the policy (unless given), train it, save OUTPUT_DIR/final in bf16 shards (with LoRA: the adapter, which
    `hf:` merges into the policy it started from) and OUTPUT_DIR/sft_summary.json (the loss per logged step, sizes,
    duration); return the summary."""
    torch = require("torch", "train", "Cold-start SFT")
    out = Path(config.output_dir)
    if (out / FINAL_DIR).exists():
        raise FileExistsError(f"{out / FINAL_DIR} already exists; choose another output folder")
    rows = read_rows(config.data)
    write_run_record(out, "sft", config.seed, asdict(config))
    started = time.perf_counter()
    policy_path = config.policy_path or str(build_policy(out / POLICY_DIR, policy_texts(rows), config.policy))
    trainer = sft_trainer(config, rows, policy_path)
    tokenizer = trainer.processing_class
    outcome = trainer.train()
    final = out / FINAL_DIR
    trainer.model.to(torch.bfloat16).save_pretrained(final, max_shard_size=config.max_shard_size)
    tokenizer.save_pretrained(final)
    losses = [{"step": entry["step"], "loss": entry["loss"]} for entry in trainer.state.log_history if "loss" in entry]
    summary = {
        "config": asdict(config),
        "rows": len(rows),
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "trained_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "steps": trainer.state.global_step,
        "loss": losses,
        "train_loss": outcome.training_loss,  # the mean over all steps
        "train_tokens": sum(len(ids) for ids in trainer.train_dataset["input_ids"]),
        "longest_row_tokens": max(len(ids) for ids in trainer.train_dataset["input_ids"]),
        "median_answer_tokens": statistics.median(
            sum(label != IGNORED for label in labels) for labels in trainer.train_dataset["labels"]),
        "duration_s": round(time.perf_counter() - started, 1),
        "final": str(final),
        "largest_file_bytes": max(path.stat().st_size for path in final.iterdir()),
        "weights_sha256": weights_digest(final),
    }
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def weights_digest(folder: Path) -> str:
    """sha256 over the saved weights (every *.safetensors, in name order): a policy rebuilt from the same seeds and
    data on another machine is the same policy exactly when the digests agree, and an adapter trained over one then
    fits the other (docs/miniature.md)."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m drkernel.train.sft", description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="sft.jsonl from drkernel.train.synthetic_sft")
    parser.add_argument("--out", required=True, help="output folder: policy/, final/, sft_summary.json")
    shape_defaults = {k: v for k, v in asdict(SFTRunConfig("", "").policy).items() if k != "seed"}  # --seed: both
    for name, value in shape_defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value, help="policy shape")
    skipped = {"data", "output_dir", "policy"}
    for item in dataclasses.fields(SFTRunConfig):
        if item.name in skipped:
            continue
        default = item.default
        flag = f"--{item.name.replace('_', '-')}"
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        else:
            parser.add_argument(flag, type=str if default is None else type(default), default=default)
    args = parser.parse_args(argv)
    try:
        config = SFTRunConfig(
            data=args.data, output_dir=args.out,
            policy=PolicyShape(**{name: getattr(args, name) for name in shape_defaults}, seed=args.seed),
            **{item.name: getattr(args, item.name) for item in dataclasses.fields(SFTRunConfig) if item.name not in skipped},
        )
        summary = run_sft(config)
    except (ValueError, FileExistsError, OSError) as exc:
        parser.exit(2, f"error: {exc}\n")
    print(json.dumps({key: summary[key] for key in ("rows", "parameters", "steps", "duration_s", "final",
                                                    "weights_sha256")}))


if __name__ == "__main__":
    main()
