#!/usr/bin/env bash
# Create .venv with drkernel installed, without ever pulling CUDA torch from the registry onto a CPU machine.
# - A machine whose python3 already has CUDA torch (a GPU image): the venv sees those packages and uses them.
# - Otherwise: CPU torch 2.13.0 from a local wheel (pip's find-links), then drkernel and its extras.
set -euo pipefail
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
EXTRAS=${EXTRAS:-dev}

if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "setup: CUDA torch found in $PY; the venv reuses the machine's torch and triton"
    "$PY" -m venv --system-site-packages "$VENV"
else
    "$PY" -m venv "$VENV"
    if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
        # The "+cpu" local version exists only as a CPU build: a local wheel (pip's find-links) or PyTorch's own
        # CPU index. PyPI has none, so this can never pull the multi-GB CUDA build.
        echo "setup: installing CPU torch ${TORCH_VERSION:=2.13.0}+cpu"
        "$VENV/bin/pip" install -q "torch==$TORCH_VERSION+cpu" ||
            "$VENV/bin/pip" install -q "torch==$TORCH_VERSION+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
    fi
fi
"$VENV/bin/pip" install -q -e ".[$EXTRAS]"
if [[ ",$EXTRAS," == *,dev,* ]]; then
    # verl for the plugin's tests, without its declared dependencies: verl 0.9.1 pins transformers<5.11 (and with it
    # an older huggingface_hub and tokenizers than the rest of the suite runs on) and pulls wandb and tensorboard,
    # which none of the modules the tests import need. `dev` lists the ones they do (tensordict, hydra-core,
    # codetiming, and TransferQueue and torchdata for the v1 trainer). `pip install drkernel[verl]` installs verl
    # with all its dependencies, in an environment of its own (docs/integrations.md).
    VERL=verl$(grep -o '"verl\[verl-core\]==[^"]*"' pyproject.toml | grep -o '==[^"]*')
    echo "setup: installing $VERL without its dependencies (see scripts/setup-venv.sh)"
    "$VENV/bin/pip" install -q --no-deps "$VERL"
fi
touch "$VENV/.installed"
