#!/bin/bash
# Lease D: the test-split benches (4 samples x 3 turns) of lease 9's four replicates of the recipe and of the SFT
# policy (a), over the SFT rebuilt with --full-determinism (its digest against lease 9's), on $2 GPUs; with several
# GPUs, first (from the start, beside the conversion and the SFT on GPU 0) the judge's rate with one scheduler alone
# on this host, then one on each other GPU at once. $1: the epoch second to pack by; $2: GPUs (1 or 4).
END=$1; GPUS=${2:-1}
SHA9=ae3274562a3bc0df190ab988af7e8214b6253189ce4b3109b96520039783e683
cd /tmp/repo || exit 1
. .carry/S15/pre.sh
export PYTHONPATH=/tmp/repo:/tmp/site
M="python3 benchmarks/miniature.py --root /tmp/mini --base /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf"
say() { echo "=== $(date -u +%H:%M:%S) $*"; }
left() { local s=$(( END - 50 - $(date +%s) )); [ $s -gt 1 ] && echo $s || echo 1; }
say "start; pack by $(date -u -d @$END +%H:%M:%S); $GPUS GPUs; tree $(cat /tmp/repo/.carry/S15/TREE 2>/dev/null)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nproc; free -g | head -2
mkdir -p /tmp/out /tmp/mini/sft_data
( while [ ! -f /tmp/mini/DONE ]; do
    { echo "--- $(date -u +%H:%M:%S) $(cat /proc/loadavg)"; top -b -n 1 -w 200 -o %CPU | sed -n 7,32p
      nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader; } >> /tmp/mini/host.log
    sleep 120; done ) &
if [ "$GPUS" -gt 1 ]; then  # the judge's rate on this host, from the start (the GGUF's conversion and the SFT beside
  # on GPU 0 at most): one scheduler alone (GPU 1), then one on each of GPUs 1-3 at once
  R="python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0"
  ( say "rate alone"; CUDA_VISIBLE_DEVICES=1 $R --out /tmp/out/alone > /tmp/mini/rate_alone.log 2>&1
    say "rate three at once"
    for g in 1 2 3; do CUDA_VISIBLE_DEVICES=$g $R --out /tmp/out/three$g > /tmp/mini/rate_three$g.log 2>&1 & done; wait
    say "rates done"; echo rates done >> /tmp/mini/rate_alone.log ) &
fi
gunzip -c docs/data/mini/session12/sft_mix.jsonl.gz > /tmp/mini/sft_data/sft.jsonl
say "splits mix (carried)"; CUDA_VISIBLE_DEVICES=0 $M splits mix --gpus 1; say "rc $?"
for i in $(seq 300); do [ -f /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf ] && break; sleep 2; done
say "base"; CUDA_VISIBLE_DEVICES=0 $M base --gpus 1; say "base rc $?"
say "sft, full determinism"; CUDA_VISIBLE_DEVICES=0 $M sft --gpus 1 --sft-args=--full-determinism; say "sft rc $?"
SHA=$(python3 -c "import json; print(json.load(open('/tmp/mini/sft/sft_summary.json')).get('weights_sha256'))")
[ "$SHA" = "$SHA9" ] && say "SFT weights are lease 9's ($SHA)" || say "SFT weights DIFFER from lease 9's: $SHA (lease 9: $SHA9); the benches run over a sibling"
for i in $(seq 300); do [ -f /tmp/mini/S14B.ok ] && break; sleep 2; done
[ "$GPUS" -gt 1 ] && while ! grep -q "rates done" /tmp/mini/rate_alone.log 2>/dev/null; do sleep 2; done
[ "$GPUS" -gt 1 ] && for f in /tmp/out/alone /tmp/out/three1 /tmp/out/three2 /tmp/out/three3; do python3 -c "import json,sys; r=json.load(open(sys.argv[1]+'/rl_batch.json')); print(sys.argv[1], 'distinct/min', r.get('distinct_per_minute_running'), 'phases', {k: r['phase_median_s'].get(k) for k in ('correctness','timing','profile','ablation','start_latency')})" $f; done
say "benches, $(left) s"
$M bench --gpus $GPUS --policies sft recipe recipe-s1 recipe-s2 recipe-s3 --time-limit-s $(left); say "pool rc $?"
wc -l /tmp/mini/bench/*/generation_errors.jsonl 2>/dev/null  # 128-row batches were untested before this lease
cd /tmp/mini && tar -czf /tmp/out/runs.tgz --exclude='checkpoint-*' --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
    bench logs lease.log host.log rate_*.log sft/sft_summary.json 2>/dev/null  # bench/*/generation_errors.jsonl too
tar -czf /tmp/out/rates.tgz -C /tmp/out alone three1 three2 three3 2>/dev/null; rm -rf /tmp/out/alone /tmp/out/three*
ls -la /tmp/out; say "done"
touch /tmp/mini/DONE
