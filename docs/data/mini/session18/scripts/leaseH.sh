#!/bin/bash
# Lease 14 (one H100): the SFT policy (a) rebuilt with --full-determinism (its digest against lease 13's); lease 13's
# run of the recipe (d), seed 1, resumed from its last checkpoint to its 30 steps; then the test-split benches (32
# tasks x 4 samples x 3 turns) of that run's policy and of (a), one after the other. $1: the epoch second to pack by.
END=$1
SHAE=fa16adbdf55b3fc0ec020c3a2867aab135e420270cf67c17ea423e2fe6d0924a
cd /tmp/repo || exit 1
. .carry/S18/pre.sh
export PYTHONPATH=/tmp/repo:/tmp/site
M="python3 benchmarks/miniature.py --root /tmp/mini --base /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf"
say() { echo "=== $(date -u +%H:%M:%S) $*"; }
say "start; pack by $(date -u -d @$END +%H:%M:%S); tree $(cat /tmp/repo/.carry/S18/TREE 2>/dev/null)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
nproc; free -g | head -2
mkdir -p /tmp/out /tmp/mini/sft_data /tmp/mini/rl/recipe-s1
( while [ ! -f /tmp/mini/DONE ]; do
    { echo "--- $(date -u +%H:%M:%S) $(cat /proc/loadavg)"; top -b -n 1 -w 200 -o %CPU | sed -n 7,32p
      nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader; } >> /tmp/mini/host.log
    sleep 120; done ) &
gunzip -c docs/data/mini/session12/sft_mix.jsonl.gz > /tmp/mini/sft_data/sft.jsonl
say "splits mix (carried)"; $M splits mix --gpus 1; say "rc $?"
for i in $(seq 300); do [ -f /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf ] && break; sleep 2; done
say "base"; $M base --gpus 1; say "base rc $?"
say "sft, full determinism"; $M sft --gpus 1; say "sft rc $?"
SHA=$(python3 -c "import json; print(json.load(open('/tmp/mini/sft/sft_summary.json')).get('weights_sha256'))")
[ "$SHA" = "$SHAE" ] && say "SFT weights are leases 11-13's ($SHA)" || say "SFT weights DIFFER from leases 11-13's: $SHA"
for i in $(seq 120); do [ -f /tmp/state/run13.tgz ] && break; sleep 2; done
cat /tmp/state/ckpt.tar.part* > /tmp/ckpt.tar
[ "$(sha256sum < /tmp/ckpt.tar | cut -c1-64)" = 25db2aaf77381eea5de1fd4cdb429e56b09f9b6347d86653b1bf6d32754459f9 ] && say "lease 13's checkpoint whole" || say "CHECKPOINT NOT WHOLE"
tar -xf /tmp/ckpt.tar -C /tmp/mini/rl/recipe-s1 || say "NO CHECKPOINT"
tar -xzf /tmp/state/run13.tgz -C /tmp/mini/rl/recipe-s1 && ls -la /tmp/mini/rl/recipe-s1
L=$(( END - 45 - $(date +%s) )); say "rl recipe-s1 resumed to 30 steps, then benches of recipe-s1 and sft, $L s"
$M rl bench --gpus 1 --policies recipe-s1 sft --rl-set num_generations=4 --rl-set per_device_train_batch_size=8 \
    --rl-set gradient_accumulation_steps=2 --rl-set max_steps=30 --time-limit-s $L; say "rl bench rc $?"
sha256sum /tmp/mini/rl/recipe-s1/final/adapter_model.safetensors
cd /tmp/mini && tar -czf /tmp/out/runs.tgz --exclude='checkpoint-*' --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
    rl bench logs lease.log host.log sft/sft_summary.json 2>/dev/null
[ -d /tmp/mini/rl/recipe-s1/final ] && tar -czf /tmp/out/adapter.tgz -C /tmp/mini/rl/recipe-s1/final .
ls -la /tmp/out; say "done"
touch /tmp/mini/DONE
