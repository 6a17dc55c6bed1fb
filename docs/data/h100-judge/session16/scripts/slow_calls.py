"""The sixteenth session's reading of its rl_batch records: per run, the candidates' and the reference's timed calls
that were slow (above twice their side's fastest + 5 us), how many of them blocked in the kernel, were preempted or
faulted memory in while their host enqueued them (`host_interruptions`, calls B and C only), and slow medians.

    python docs/data/h100-judge/session16/scripts/slow_calls.py docs/data/h100-judge/session16/call*_rl_batch_*.json.gz
"""
import gzip
import json
import statistics
import sys


def slow(value, fastest):
    return value > 2 * fastest + 0.005


for path in sys.argv[1:]:
    rows = json.load(gzip.open(path))["runs"]["batch"]["problems"].values()
    timed = [r for r in rows if r.get("calls_ms") and r["calls_ms"].get("candidate")]
    line = [path.rsplit("/", 1)[-1], f"timed {len(timed)}"]
    for side in ("candidate", "reference"):
        calls = seen = 0
        kinds = [0, 0, 0]
        for r in timed:
            values, fastest = r["calls_ms"][side], min(r["calls_ms"][side])
            counts = r.get("host_interruptions", {}).get(side) or [None] * len(values)
            for value, count in zip(values, counts):
                if slow(value, fastest):
                    calls += 1
                    if count is not None:
                        seen += 1
                        kinds = [k + (c > 0) for k, c in zip(kinds, count)]
        line.append(f"{side}: {calls} slow calls" + (f" (blocked {kinds[0]}, preempted {kinds[1]}, faulted {kinds[2]})"
                                                     if seen else ""))
    medians = sum(slow(statistics.median(r["calls_ms"]["candidate"]), min(r["calls_ms"]["candidate"])) for r in timed)
    line.append(f"slow candidate medians {medians}, measured again {sum(r.get('measurements') == 2 for r in timed)}")
    print("; ".join(line))
