#!/bin/bash
# Lease C (four H100s): two SFTs of lease 6's mix at once with full determinism (GPUs 0 and 1: do their digests
# agree?), then four replicates of the recipe (d) at 4 prompts x 4 samples a step, one a GPU, then the test-split
# benches of (a) and the replicates until the time limit. $1: the epoch second to pack by.
END=$1
cd /tmp/repo || exit 1
. .carry/S14/pre.sh
export PYTHONPATH=/tmp/repo:/tmp/site
M="python3 benchmarks/miniature.py --root /tmp/mini --base /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf"
say() { echo "=== $(date -u +%H:%M:%S) $*"; }
say "start; pack by $(date -u -d @$END +%H:%M:%S); tree $(cat /tmp/repo/.carry/S14/TREE 2>/dev/null)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton, transformers, trl, peft; print(torch.__version__, triton.__version__, transformers.__version__, trl.__version__, peft.__version__)"
nproc; free -g | head -2
mkdir -p /tmp/out /tmp/mini/sft_data
# the host every 120 s: what uses the CPUs while the runs judge (lease 6's four runs judged 2.4x slower than one alone)
( while [ ! -f /tmp/mini/DONE ]; do
    { echo "--- $(date -u +%H:%M:%S) $(cat /proc/loadavg)"; top -b -n 1 -w 200 -o %CPU | sed -n 7,32p
      nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader; } >> /tmp/mini/host.log
    sleep 120; done ) &
gunzip -c docs/data/mini/session12/sft_mix.jsonl.gz > /tmp/mini/sft_data/sft.jsonl
say "splits mix (carried)"; CUDA_VISIBLE_DEVICES=0 $M splits mix --gpus 1; say "rc $?"
for i in $(seq 300); do [ -f /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf ] && break; sleep 2; done
say "base"; CUDA_VISIBLE_DEVICES=0 $M base --gpus 1; say "base rc $?"
# the second SFT: the first's command with another output folder, on GPU 1, at the same time
SFT2=$($M sft --dry-run --sft-args=--full-determinism | sed -n 's/^\[sft\] //p' | sed -e 's# --out /tmp/mini/sft # --out /tmp/mini/sft2 #' -e 's/^python /python3 /')
say "sft x2, full determinism: $SFT2"
(CUDA_VISIBLE_DEVICES=1 $SFT2 > /tmp/mini/sft2.log 2>&1; echo "sft2 rc $?" >> /tmp/mini/sft2.log) &
CUDA_VISIBLE_DEVICES=0 $M sft --gpus 1 --sft-args=--full-determinism; say "sft rc $?"
while [ ! -f /tmp/mini/sft2/sft_summary.json ] && ! grep -q "sft2 rc" /tmp/mini/sft2.log; do sleep 2; done
say "sft2 done"; tail -n 3 /tmp/mini/sft2.log
for d in sft sft2; do python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(sys.argv[1], 'weights_sha256', s.get('weights_sha256'), 'train_s', s.get('duration_s'))" /tmp/mini/$d/sft_summary.json; done
L=$(( END - 50 - $(date +%s) )); say "pool, $L s"
$M rl bench --gpus 4 --policies sft recipe recipe-s1 recipe-s2 recipe-s3 \
    --rl-set num_generations=4 --rl-set per_device_train_batch_size=8 --rl-set gradient_accumulation_steps=2 \
    --time-limit-s $L; say "pool rc $?"
cd /tmp/mini && tar -czf /tmp/out/runs.tgz --exclude='checkpoint-*' --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
    rl bench logs lease.log host.log sft2.log sft/sft_summary.json sft2/sft_summary.json 2>/dev/null
for r in recipe recipe-s1 recipe-s2 recipe-s3; do
    f=/tmp/mini/rl/$r/final/adapter_model.safetensors
    [ -f $f ] || f=$(ls -d /tmp/mini/rl/$r/checkpoint-*/adapter_model.safetensors 2>/dev/null | tail -1)
    [ -n "$f" ] && [ -f "$f" ] && cp "$f" /tmp/out/${r}_adapter.safetensors
done
ls -la /tmp/out; say "done"
touch /tmp/mini/DONE
