#!/usr/bin/env bash
# The GPU red team as root and as a created ordinary user, the new GPU exploits judged by the tree before the
# channel and timing changes (.old/), and the ordinary user's view of the layers. Run from the repository root on a
# machine with one GPU; writes to $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
PY=$(command -v python3)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/env.txt
$PY -c "import torch, triton, platform; print(torch.__version__, triton.__version__, platform.python_version())" | tee -a $OUT/env.txt
git rev-parse HEAD 2>/dev/null | tee -a $OUT/env.txt
# a copy every user can read
rm -rf /tmp/repo && cp -r . /tmp/repo && chmod -R a+rX /tmp/repo && cd /tmp/repo
id -u kerneluser >/dev/null 2>&1 || useradd -m -u 1001 kerneluser
PYTHONPATH=/tmp/repo $PY -m drkernel.cli.main doctor --json > $OUT/doctor_root.json
PYTHONPATH=/tmp/repo $PY tests/ordinary_user.py 1001 /home/kerneluser -- env PYTHONPATH=/tmp/repo $PY -m drkernel.cli.main doctor --json > $OUT/doctor_user.json 2>&1
echo "== red team as root"
timeout 200 env PYTHONPATH=/tmp/repo $PY -m pytest -q -p no:cacheprovider -rfEx tests/test_hacking.py 2>&1 | tail -25 | tee $OUT/redteam_root.txt
echo "== red team as uid 1001"
timeout 200 $PY tests/ordinary_user.py 1001 /home/kerneluser -- env PYTHONPATH=/tmp/repo $PY -m pytest -q -p no:cacheprovider -rfEx --rootdir /tmp/repo --basetemp /home/kerneluser/pt /tmp/repo/tests/test_hacking.py 2>&1 | tail -25 | tee $OUT/redteam_user.txt
echo "== new GPU cases, old tree and new tree"
for tree in /tmp/repo/.old /tmp/repo; do
  for case in tests/exploits/j2_cublas_on_a_side_stream_when_timed.py tests/exploits/j5_graph_replayed_on_a_side_stream_when_timed.py tests/legit/matmul_two_streams_joined.py tests/exploits/j1_side_stream.py tests/legit/fresh_inputs_every_timed_call.py tests/exploits/n1_channel_taken_over.py; do
    task=$(grep -m1 '^# task:' $case | awk '{print $3}')
    ref=tests/exploits/tasks/$task.py; [ -f $ref ] || ref=examples/tasks/$task.py
    timeout 120 env PYTHONPATH=$tree $PY -m drkernel.cli.main eval -r $ref -c $case --device cuda --json 2>/dev/null \
      | $PY -c "import json,sys; d=json.load(sys.stdin); t=d.get('timing') or {}; print('$tree'.split('/')[-1] or 'new', '$case'.split('/')[-1], d['status'], d['hack_reasons'], d['speedup'], (d.get('error') or {}).get('message','')[:120])" | tee -a $OUT/cases.txt
  done
done
