"""`drkernel train`: multi-turn RL on TRL from a YAML config (drkernel.train.config.TrainConfig).

The trainer and TRL load when the command runs, so the other commands pay nothing for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from drkernel.cli.common import err, flag
from drkernel.errors import UsageError


def train_command(
    config: Optional[Path] = typer.Option(None, "--config", help="A YAML file of TrainConfig fields."),
    overrides: Optional[list[str]] = typer.Option(None, "--set", help="key=value, overriding the file; repeatable."),
    resume: bool = flag("--resume", help="Continue from the last checkpoint in output_dir."),
    log_samples: Optional[Path] = typer.Option(
        None, "--log-samples",
        help="JSONL: one line per (step, prompt, sample, turn) with its advantage, kept and code.",
    ),
) -> None:
    """Train a policy with the Dr. Kernel recipe (TRLOO, PR, PRS, MRS) on KernelGym rewards."""
    from drkernel.train.config import load_config

    settings = list(overrides or []) + ([f"log_samples={log_samples}"] if log_samples else [])
    cfg = load_config(config, settings)
    from drkernel.train.rollout import EvaluatorUnavailable
    from drkernel.train.checkpoints import last_checkpoint
    from drkernel.train.run import train

    try:
        trainer = train(cfg, resume=resume)
    except ImportError as exc:  # an optional package a setting needs, e.g. use_vllm without vLLM
        raise UsageError(str(exc)) from exc
    except EvaluatorUnavailable as exc:
        checkpoint = last_checkpoint(cfg.output_dir)
        where = f"the last checkpoint {checkpoint} is intact; rerun with --resume" if checkpoint else "no checkpoint yet"
        raise EvaluatorUnavailable(f"the training step failed: {exc}; {where}") from exc
    err.print(f"trained {trainer.state.global_step} steps; metrics in {Path(cfg.output_dir) / 'metrics.jsonl'}")
