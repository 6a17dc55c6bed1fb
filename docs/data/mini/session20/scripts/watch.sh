# a call's watch over the daemon, for at most $1 s; copies /tmp/out to $OUT when it is done
T0=$(date +%s)
while [ $(( $(date +%s) - T0 )) -lt $1 ] && [ ! -f /tmp/mini/DONE ]; do sleep 10; done
tail -n 50 /tmp/mini/lease.log
for f in /tmp/mini/rl/*/metrics.jsonl; do [ -f "$f" ] && echo "$f: $(wc -l < $f) steps; rewards $(python3 -c 'import json,sys; print([round(json.loads(l).get("reward_mean", -1), 2) for l in open(sys.argv[1])])' $f)"; done
for f in /tmp/mini/*/*/summary.json; do [ -f "$f" ] && echo "$f: $(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s.get("per_turn",{}).get("fast_1_2"), s.get("best_of_history",{}).get("fast_1_2"), s.get("incomplete_trajectories"))' $f)"; done
nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
if [ -f /tmp/mini/DONE ]; then cp /tmp/out/* $OUT/; ls -la $OUT; fi
