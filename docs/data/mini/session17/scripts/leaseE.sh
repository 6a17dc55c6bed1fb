#!/bin/bash
# Lease E (one H100): the SFT policy (a) rebuilt from lease 6's mix with --full-determinism (its digest against lease
# 9's, an H200's), then one run of the recipe (d) at 4 prompts x 4 samples a step, as lease 9's, for 20 steps instead
# of 10 (the learning rate falls to 0 over the 20), seed 0; its adapter comes back for lease F's benches.
# $1: the epoch second to pack by.
END=$1
SHA9=ae3274562a3bc0df190ab988af7e8214b6253189ce4b3109b96520039783e683
cd /tmp/repo || exit 1
. .carry/S17/pre.sh
export PYTHONPATH=/tmp/repo:/tmp/site
M="python3 benchmarks/miniature.py --root /tmp/mini --base /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf"
say() { echo "=== $(date -u +%H:%M:%S) $*"; }
say "start; pack by $(date -u -d @$END +%H:%M:%S); tree $(cat /tmp/repo/.carry/S17/TREE 2>/dev/null)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton, transformers, trl, peft; print(torch.__version__, triton.__version__, transformers.__version__, trl.__version__, peft.__version__)"
nproc; free -g | head -2
mkdir -p /tmp/out /tmp/mini/sft_data
( while [ ! -f /tmp/mini/DONE ]; do
    { echo "--- $(date -u +%H:%M:%S) $(cat /proc/loadavg)"; top -b -n 1 -w 200 -o %CPU | sed -n 7,32p
      nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader; } >> /tmp/mini/host.log
    sleep 120; done ) &
gunzip -c docs/data/mini/session12/sft_mix.jsonl.gz > /tmp/mini/sft_data/sft.jsonl
say "splits mix (carried)"; $M splits mix --gpus 1; say "rc $?"
for i in $(seq 300); do [ -f /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf ] && break; sleep 2; done
say "base"; $M base --gpus 1; say "base rc $?"
say "sft, full determinism"; $M sft --gpus 1 --sft-args=--full-determinism; say "sft rc $?"
SHA=$(python3 -c "import json; print(json.load(open('/tmp/mini/sft/sft_summary.json')).get('weights_sha256'))")
[ "$SHA" = "$SHA9" ] && say "SFT weights are lease 9's ($SHA)" || say "SFT weights differ from lease 9's (H200): $SHA"
L=$(( END - 40 - $(date +%s) )); say "rl recipe, 20 steps, $L s"
$M rl --gpus 1 --policies recipe --rl-set num_generations=4 --rl-set per_device_train_batch_size=8 \
    --rl-set gradient_accumulation_steps=2 --rl-set max_steps=20 --time-limit-s $L; say "rl rc $?"
cd /tmp/mini && tar -czf /tmp/out/runs.tgz --exclude='checkpoint-*' --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
    rl logs lease.log host.log sft/sft_summary.json 2>/dev/null
F=/tmp/mini/rl/recipe/final; [ -d $F ] || F=$(ls -d /tmp/mini/rl/recipe/checkpoint-* 2>/dev/null | tail -1)
[ -n "$F" ] && tar -czf /tmp/out/recipe_adapter.tgz -C $F --exclude='optimizer.pt' --exclude='*.pth' --exclude='scheduler.pt' . && say "adapter from $F"
sha256sum $F/adapter_model.safetensors
ls -la /tmp/out; say "done"
touch /tmp/mini/DONE
