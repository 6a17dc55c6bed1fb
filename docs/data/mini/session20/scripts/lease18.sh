#!/bin/bash
# Lease 18 (one H100): the SFT policy (a) rebuilt with --full-determinism (its digest against leases 11-17's); lease
# 17's run of (b) GRPO, seed 1, resumed from its last checkpoint (the bundle carried beside the GGUF's chunks) to its
# 30 steps; then the test-split bench (32 tasks x 4 samples x 3 turns) of its policy. $1: the epoch second to pack by.
END=$1
SHAE=fa16adbdf55b3fc0ec020c3a2867aab135e420270cf67c17ea423e2fe6d0924a
NAME=grpo-s1
cd /tmp/repo || exit 1
. .carry/S20/pre.sh
export PYTHONPATH=/tmp/repo:/tmp/site
M="python3 benchmarks/miniature.py --root /tmp/mini --base /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf"
say() { echo "=== $(date -u +%H:%M:%S) $*"; }
say "start; pack by $(date -u -d @$END +%H:%M:%S); tree $(cat /tmp/repo/.carry/S20/TREE 2>/dev/null)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
nproc; free -g | head -2
mkdir -p /tmp/out /tmp/mini/sft_data /tmp/mini/rl
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
[ "$SHA" = "$SHAE" ] && say "SFT weights are leases 11-17's ($SHA)" || say "SFT weights DIFFER from leases 11-17's: $SHA"
for i in $(seq 120); do [ -d /tmp/ckin/$NAME ] && break; sleep 2; done
[ -d /tmp/ckin/$NAME ] && mv /tmp/ckin/$NAME /tmp/mini/rl/ && ls -la /tmp/mini/rl/$NAME || say "NO CHECKPOINT"
L=$(( END - 50 - $(date +%s) )); say "rl $NAME resumed to 30 steps, then its bench, $L s"
$M rl bench --gpus 1 --policies $NAME --rl-set num_generations=4 --rl-set per_device_train_batch_size=8 \
    --rl-set gradient_accumulation_steps=2 --rl-set max_steps=30 --time-limit-s $L; say "rl bench rc $?"
sha256sum /tmp/mini/rl/$NAME/final/adapter_model.safetensors
L=$(( END - 60 - $(date +%s) ))
if [ $L -gt 170 ]; then  # the 20 level-1 problems with the output buffers made at the warm-up (issue 20; last measured on 55766fe)
  T=$(( L - 40 )); [ $T -gt 150 ] && T=150; say "level-1 set, $T s"
  CUDA_VISIBLE_DEVICES=0 timeout $T python3 benchmarks/gpu_bench.py kernelbench --kernelbench /tmp/repo/.carry/S20/kb.jsonl \
      --out /tmp/mini/kb > /tmp/mini/kb.log 2>&1; say "level-1 rc $?"
  python3 -c "import json; d=json.load(open('/tmp/mini/kb/kernelbench.json')); p=d['problems']; print(round(d['per_minute_running'],2), d.get('gate_serial_s'), sum(v['status']=='correct' for v in p.values()), len(p))"
fi
L=$(( END - 60 - $(date +%s) )); [ $L -gt 240 ] && L=240
if [ $L -gt 150 ]; then  # the red team on this GPU, with the output buffers made at the warm-up (issue 20)
  say "red team, $L s"; ( cd /tmp/repo && DRKERNEL_TEST_DEVICE=cuda timeout $L python3 -m pytest -q -p no:cacheprovider -o addopts="" \
      -rfEx tests/test_hacking.py tests/test_precision.py > /tmp/mini/redteam_h100.txt 2>&1; echo "rc $?" >> /tmp/mini/redteam_h100.txt )
  tail -n 5 /tmp/mini/redteam_h100.txt
fi
cd /tmp/mini && tar -czf /tmp/out/runs.tgz --exclude='checkpoint-*' --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
    rl bench logs lease.log host.log redteam_h100.txt kb kb.log sft/sft_summary.json 2>/dev/null
[ -d /tmp/mini/rl/$NAME/final ] && tar -czf /tmp/out/adapter.tgz -C /tmp/mini/rl/$NAME/final .
ls -la /tmp/out; say "done"
touch /tmp/mini/DONE
