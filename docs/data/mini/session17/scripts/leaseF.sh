#!/bin/bash
# Lease F (one H100): the SFT policy (a) rebuilt with --full-determinism (its digest against lease E's), then the
# test-split benches (32 tasks x 4 samples x 3 turns) of (a) and of lease E's recipe (d), 20 steps, one after the
# other on the one GPU. $1: the epoch second to pack by.
END=$1
SHAE=fa16adbdf55b3fc0ec020c3a2867aab135e420270cf67c17ea423e2fe6d0924a
cd /tmp/repo || exit 1
. .carry/S17/pre.sh
export PYTHONPATH=/tmp/repo:/tmp/site
M="python3 benchmarks/miniature.py --root /tmp/mini --base /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf"
say() { echo "=== $(date -u +%H:%M:%S) $*"; }
say "start; pack by $(date -u -d @$END +%H:%M:%S); tree $(cat /tmp/repo/.carry/S17/TREE 2>/dev/null)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
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
[ "$SHA" = "$SHAE" ] && say "SFT weights are lease E's ($SHA)" || say "SFT weights DIFFER from lease E's: $SHA (lease E: $SHAE); (d) is benched over a sibling"
for i in $(seq 300); do [ -f /tmp/mini/rl/recipe/final/adapter_model.safetensors ] && break; sleep 2; done
sha256sum /tmp/mini/rl/recipe/final/adapter_model.safetensors
L=$(( END - 50 - $(date +%s) )); say "benches, $L s"
$M bench --gpus 1 --policies sft recipe --time-limit-s $L; say "bench rc $?"
cd /tmp/mini && tar -czf /tmp/out/runs.tgz --exclude='checkpoint-*' --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
    bench logs lease.log host.log sft/sft_summary.json 2>/dev/null
ls -la /tmp/out; say "done"
touch /tmp/mini/DONE
