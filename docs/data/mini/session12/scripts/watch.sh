# a call's watch over the daemon, for at most $1 s; prints what changed; copies /tmp/out to $OUT when it is done
T0=$(date +%s)
while [ $(( $(date +%s) - T0 )) -lt $1 ] && [ ! -f /tmp/mini/DONE ]; do sleep 10; done
tail -n 60 /tmp/mini/lease.log
for f in /tmp/mini/rl/*/metrics.jsonl; do [ -f "$f" ] && echo "$f: $(wc -l < $f) steps; last reward $(tail -n1 $f | python3 -c 'import json,sys; print(round(json.load(sys.stdin).get("reward_mean", -1), 3))')"; done
nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
if [ -f /tmp/mini/DONE ]; then cp /tmp/out/* $OUT/; ls -la $OUT; fi
