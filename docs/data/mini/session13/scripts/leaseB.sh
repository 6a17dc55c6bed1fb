#!/bin/bash
# Lease B (one H100): the SFT policy again from lease 6's mix, lease A's recipe adapter over it; STTS of (d), the
# transfers of (d) and (a), then the rest of (a)'s test bench (resumed only over the same SFT weights as lease A's).
END=$1
SHA_A=fd83fac62ddad3dae843266af1ed6a7b8f74aba0ceb0b10b6c8620e543e913a8
cd /tmp/repo || exit 1
. .carry/S13/pre.sh
export PYTHONPATH=/tmp/repo:/tmp/site
M="python3 benchmarks/miniature.py --root /tmp/mini --base /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf --gpus 1"
say() { echo "=== $(date -u +%H:%M:%S) $*"; }
left() { local s=$(( END - 40 - $(date +%s) )); [ $s -gt 1 ] && echo $s || echo 1; }
say "start; pack by $(date -u -d @$END +%H:%M:%S); tree $(cat /tmp/repo/.carry/S13/TREE 2>/dev/null)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
mkdir -p /tmp/out /tmp/mini/sft_data
gunzip -c docs/data/mini/session12/sft_mix.jsonl.gz > /tmp/mini/sft_data/sft.jsonl
say "splits mix (carried)"; $M splits mix; say "rc $?"
for i in $(seq 300); do [ -f /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf ] && break; sleep 2; done
say "base sft"; $M base sft; say "sft rc $?"
SHA=$(python3 -c "import json; print(json.load(open('/tmp/mini/sft/sft_summary.json')).get('weights_sha256'))")
echo "weights_sha256 $SHA (lease A: $SHA_A)"
for i in $(seq 300); do [ -f /tmp/state/S13B.ok ] && break; sleep 2; done
mkdir -p /tmp/mini/rl /tmp/mini/bench && cp -r /tmp/state/S13B/rl/recipe /tmp/mini/rl/ && gunzip /tmp/mini/rl/recipe/final/tokenizer.json.gz
if [ "$SHA" = "$SHA_A" ]; then
  cp -r /tmp/state/S13B/bench/sft /tmp/mini/bench/ && gunzip /tmp/mini/bench/sft/trajectories.jsonl.gz; say "same SFT weights as lease A: (a)'s bench resumes"
else say "SFT weights differ from lease A's: (a)'s bench starts over"; fi
say "stts recipe, $(left) s"; $M stts --policies recipe --time-limit-s $(left); say "rc $?"
say "transfer, $(left) s"; $M transfer --policies recipe sft --transfer-tasks /tmp/repo/.carry/S13/kb.jsonl --time-limit-s $(left); say "rc $?"
say "bench sft, $(left) s"; $M bench --policies sft --time-limit-s $(left); say "rc $?"
cd /tmp/mini && tar -czf /tmp/out/runs.tgz --exclude='checkpoint-*' --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' \
    bench/sft stts transfer logs lease.log sft/sft_summary.json 2>/dev/null
ls -la /tmp/out; say "done"
touch /tmp/mini/DONE
