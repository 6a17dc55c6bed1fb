#!/bin/bash
# Lease 17 (one H100): the RL-shaped batch alone while the GGUF's chunks come (issue 20: a replicate of lease 15's
# measurement, 0 of 1,040 timed calls allocating); the SFT policy (a) rebuilt with --full-determinism (its digest
# against leases 11-16's); then (b) GRPO with seed 1 for 30 steps at 4 prompts x 4 samples (lease 15's run of (c)
# with the GRPO estimator), stopped at the pack-by time: its run folder and last checkpoint come back as a bundle of
# 12 MiB pieces, for lease 18 to resume it. $1: the epoch second to pack by.
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
python3 -c "import torch, triton, transformers, trl, peft; print(torch.__version__, triton.__version__, transformers.__version__, trl.__version__, peft.__version__)"
nproc; free -g | head -2
mkdir -p /tmp/out /tmp/mini/sft_data /tmp/rlb
( while [ ! -f /tmp/mini/DONE ]; do
    { echo "--- $(date -u +%H:%M:%S) $(cat /proc/loadavg)"; top -b -n 1 -w 200 -o %CPU | sed -n 7,32p
      nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader; } >> /tmp/mini/host.log
    sleep 120; done ) &
gunzip -c docs/data/mini/session12/sft_mix.jsonl.gz > /tmp/mini/sft_data/sft.jsonl
say "splits mix (carried)"; $M splits mix --gpus 1; say "rc $?"
say "rl_batch alone"
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0 \
    --out /tmp/rlb/run > /tmp/rlb/rl_batch.log 2>&1
say "rl_batch rc $?"; tail -n 4 /tmp/rlb/rl_batch.log | cut -c1-300
tar -czf /tmp/out/rl_batch.tgz -C /tmp/rlb .
for i in $(seq 300); do [ -f /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf ] && break; sleep 2; done
say "base"; $M base --gpus 1; say "base rc $?"
say "sft, full determinism"; $M sft --gpus 1; say "sft rc $?"
SHA=$(python3 -c "import json; print(json.load(open('/tmp/mini/sft/sft_summary.json')).get('weights_sha256'))")
[ "$SHA" = "$SHAE" ] && say "SFT weights are leases 11-16's ($SHA)" || say "SFT weights DIFFER from leases 11-16's: $SHA"
L=$(( END - 50 - $(date +%s) )); say "rl $NAME, 30 steps, stopped after $L s"
$M rl --gpus 1 --policies $NAME --rl-set num_generations=4 --rl-set per_device_train_batch_size=8 \
    --rl-set gradient_accumulation_steps=2 --rl-set max_steps=30 --time-limit-s $L; say "rl rc $?"
R=/tmp/mini/rl/$NAME
C=$(for d in $R/checkpoint-*; do [ -f $d/trainer_state.json ] && echo $d; done | sort -t- -k2 -n | tail -1)
say "last whole checkpoint: $C"; ls -la $C
mkdir -p /tmp/ckdir/$NAME && tar -cf - -C $R --exclude='checkpoint-*' . | tar -xf - -C /tmp/ckdir/$NAME && cp -r $C /tmp/ckdir/$NAME/ \
    && python3 benchmarks/bundle.py pack /tmp/out /tmp/ckdir/$NAME --chunk-mib 12 && sha256sum /tmp/out/bundle-*
cd /tmp/mini && tar -czf /tmp/out/runs.tgz --exclude='checkpoint-*' rl logs lease.log host.log sft/sft_summary.json 2>/dev/null
ls -la /tmp/out; say "done"
touch /tmp/mini/DONE
