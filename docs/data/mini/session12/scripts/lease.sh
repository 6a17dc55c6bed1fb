#!/bin/bash
# The whole lease as one daemon (setsid): it outlives the device calls, which only watch it. $1: the epoch second
# by which everything is packed. Runs from a copy of the tree in /tmp/repo; writes /tmp/mini/lease.log, and
# /tmp/out/* then /tmp/mini/DONE at the end.
END=$1
cd /tmp/repo || exit 1
. .carry/S12/pre.sh
export PYTHONPATH=/tmp/repo:/tmp/site
M="python3 benchmarks/miniature.py --root /tmp/mini --base /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf"
say() { echo "=== $(date -u +%H:%M:%S) $*"; }
say "start; pack by $(date -u -d @$END +%H:%M:%S)"; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton, transformers, trl, peft; print(torch.__version__, triton.__version__, transformers.__version__, trl.__version__, peft.__version__)"
mkdir -p /tmp/out /tmp/mini
# the red team on GPU 3 while the mix and the SFT use GPU 0 (stopped when the pool needs GPU 3)
( cd /tmp/repo && CUDA_VISIBLE_DEVICES=3 DRKERNEL_TEST_DEVICE=cuda exec setsid timeout 600 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py tests/test_precision.py > /tmp/out/redteam_gpu.txt 2>&1 ) &
RT=$!
say "splits mix"; CUDA_VISIBLE_DEVICES=0 $M splits mix --gpus 1; say "mix rc $?"
for i in $(seq 300); do [ -f /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf ] && break; sleep 2; done
say "base sft"; CUDA_VISIBLE_DEVICES=0 $M base sft --gpus 1; say "sft rc $?"
if kill -0 $RT 2>/dev/null; then say "red team still running: stopped"; pkill -TERM -f "pytest -q -p no:cacheprovider" ; sleep 3; pkill -KILL -f "pytest -q -p no:cacheprovider"; fi
L=$(( END - 45 - $(date +%s) )); say "pool, $L s"
CUDA_VISIBLE_DEVICES=0,1,2,3 $M rl bench stts transfer --gpus 4 --policies sft recipe grpo trloo \
    --transfer-tasks /tmp/repo/.carry/S12/kb.jsonl --time-limit-s $L; say "pool rc $?"
cd /tmp/mini && tar -czf /tmp/out/runs.tgz --exclude='checkpoint-*' --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
    rl bench stts transfer logs lease.log sft/sft_summary.json sft_data/mix.json $(ls -d sft_data/multi_turn_run/summary.json 2>/dev/null) 2>/dev/null
gzip -c /tmp/mini/sft_data/sft.jsonl > /tmp/out/sft.jsonl.gz
cp /tmp/mini/rl/recipe/final/adapter_model.safetensors /tmp/out/recipe_adapter.safetensors 2>/dev/null
ls -la /tmp/out; say "done"
touch /tmp/mini/DONE
