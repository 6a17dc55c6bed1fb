# Issue 20 (twenty-sixth session), fourth call: a scheduler's start-up, many times, on the final tree ("new": the
# fork server's own bytecode folder, warm after the first start, and Triton's cache key hashed while torch imports),
# the same without that thread ("nothread", a copy with the thread not started) and HEAD 87d7547 ("head"), in turn.
export PYTHONUNBUFFERED=1
W=/tmp/w4; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u
mkdir -p $W/nothread && cp -r drkernel $W/nothread/
sed -i 's/^    _TRITON_KEY.start()$/    pass/' $W/nothread/drkernel/sandbox/zygote.py; grep -c "^    pass$" $W/nothread/drkernel/sandbox/zygote.py
cat > $W/startup.py <<'PY'
import sys, time
t = time.monotonic()
from drkernel.scheduling.scheduler import Scheduler
s = Scheduler(device="cuda")
ok = s.wait_ready(timeout=120)
print(f"{sys.argv[1]} {time.monotonic() - t:.2f} {ok}")
s.close()
PY
startup() { (cd $2 && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD timeout 60 python3 $W/startup.py $1 2>&1 | tail -1); }
rm -rf ~/.cache/drkernel/bytecode
startup new-first . | tee -a $W/startup.txt
for i in 1 2 3 4 5 6 7 8; do
  startup new . | tee -a $W/startup.txt; startup nothread $W/nothread | tee -a $W/startup.txt
  [ $i -le 3 ] && startup head .carry/S26/head | tee -a $W/startup.txt
done
python3 - $W/startup.txt <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, seconds, _ = line.split()
    runs[label].append(float(seconds))
for label, values in runs.items():
    print(f"{label}: n {len(values)} median {statistics.median(values):.2f} min {min(values):.2f} max {max(values):.2f}")
PY
cp $W/startup.txt $OUT/c4_startup.txt; date -u
