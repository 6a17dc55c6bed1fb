#!/bin/bash
# Lease A (one H100): the SFT policy from lease 6's mix, the recipe's 10 steps, then the test-split benches of (d)
# and (a), 4 samples x 3 turns, in the same lease; STTS of (d) if time is left. $1: the epoch second to pack by.
END=$1
cd /tmp/repo || exit 1
. .carry/S13/pre.sh
export PYTHONPATH=/tmp/repo:/tmp/site
M="python3 benchmarks/miniature.py --root /tmp/mini --base /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf"
say() { echo "=== $(date -u +%H:%M:%S) $*"; }
say "start; pack by $(date -u -d @$END +%H:%M:%S); tree $(cat /tmp/repo/.carry/S13/TREE 2>/dev/null)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton, transformers, trl, peft; print(torch.__version__, triton.__version__, transformers.__version__, trl.__version__, peft.__version__)"
mkdir -p /tmp/out /tmp/mini/sft_data
gunzip -c docs/data/mini/session12/sft_mix.jsonl.gz > /tmp/mini/sft_data/sft.jsonl
say "splits mix (carried)"; $M splits mix --gpus 1; say "rc $?"
for i in $(seq 300); do [ -f /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf ] && break; sleep 2; done
say "base sft"; $M base sft --gpus 1; say "sft rc $?"
python3 -c "import json; s=json.load(open('/tmp/mini/sft/sft_summary.json')); print('weights_sha256', s.get('weights_sha256'))"
L=$(( END - 40 - $(date +%s) )); say "pool, $L s"
$M rl bench stts --gpus 1 --policies recipe sft --time-limit-s $L; say "pool rc $?"
cd /tmp/mini && tar -czf /tmp/out/runs.tgz --exclude='checkpoint-*' --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
    rl bench stts logs lease.log sft/sft_summary.json 2>/dev/null
cp /tmp/mini/rl/recipe/final/adapter_model.safetensors /tmp/out/recipe_adapter.safetensors 2>/dev/null
ls -la /tmp/out; say "done"
touch /tmp/mini/DONE
