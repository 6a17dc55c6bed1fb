#!/usr/bin/env bash
# Judge hosts on a host of several GPUs, one call per mode (each under ten minutes), writing to $OUT:
#   rates     the RL-shaped batch (24 tasks x 8, 192 distinct: a smaller share of ramp and tail) and the level-1 set
#             through judge hosts on 1 and 4 GPUs, and with a judge per evaluation on 1 GPU, in one run
#   legit     1,000 distinct legitimate candidates on 4 GPUs through judge hosts, in batches of 250
#   redteam   the red team through judge hosts as root (q15 included), then with a judge per evaluation on GPU 1
# KernelBench's JSONL in .kb/.
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 DRKERNEL_KERNELBENCH=$PWD/.kb/kernelbench_levels1-3.jsonl
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u) > $OUT/env.txt
E="python3 benchmarks/every_gpu.py"
case "${1:?mode: rates, legit or redteam}" in
  rates)
    timeout 400 $E --gpus 1,4 --synthetic-n 24 --rl-samples 8 --level1 20 --out /tmp/h > $OUT/hosts.log 2>&1
    gzip -c /tmp/h/every_gpu.json > $OUT/hosts.json.gz
    timeout 200 $E --gpus 1 --synthetic-n 24 --rl-samples 8 --level1 0 --no-judge-hosts --out /tmp/p > $OUT/per-eval.log 2>&1
    gzip -c /tmp/p/every_gpu.json > $OUT/per-eval.json.gz ;;
  legit)
    timeout 540 $E --gpus 4 --synthetic-n 0 --level1 0 --legit 1000 --legit-batch 250 --out /tmp/l > $OUT/legit.log 2>&1
    gzip -c /tmp/l/every_gpu.json > $OUT/legit.json.gz ;;
  redteam)
    CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 270 python3 -m pytest -q -p no:cacheprovider -rfEx \
      tests/test_isolation.py tests/test_hacking.py > $OUT/redteam-hosts.txt 2>&1
    CUDA_VISIBLE_DEVICES=1 DRKERNEL_TEST_DEVICE=cuda DRKERNEL_TEST_JUDGE_HOSTS=0 timeout 270 python3 -m pytest -q \
      -p no:cacheprovider -rfEx tests/test_hacking.py > $OUT/redteam-per-evaluation.txt 2>&1 ;;
esac
tail -4 $OUT/*.log $OUT/*.txt 2>/dev/null | tail -30
