"""The RL-shaped batch and the level-1 set on 1, 2, 4... GPUs of one host: rates, efficiency, verdicts candidate by
candidate, and every harness failure named.

    python benchmarks/every_gpu.py --gpus 1,2,4 --kernelbench $DRKERNEL_KERNELBENCH --out DIR

For each count of GPUs a fresh scheduler with that many workers and a cold Triton cache judges the distinct
candidates of an RL step's batch (`gpu_bench.rl_shaped`: `--synthetic-n` test tasks x `--rl-samples`, every answer
distinct) and then the level-1 set. Efficiency is rate(n) / (n x rate(1)). What each run says beside its rate:

- `underfull_share`: the part of the running time in which fewer evaluations ran than the scheduler runs at once
  (its ramp-up and tail): a rate is a steady state's only where this is small;
- `verdicts_changed`: candidates whose status or hack reasons differ from the first count's, and `speedup_ratio`
  (farthest and median of each candidate's speedup against the first count's);
- `harness_failures`: every legitimate candidate not judged correct (a graded solution's variant says what it is:
  fused, unfused and partial are legitimate, lazy is hacked, the wrong ones incorrect; level-1 candidates are
  legitimate), and every evaluation that ended in the harness's own failure, with its problem, status and cause;
  `unexpected_verdicts`: the other candidates judged otherwise than their variant says. Both are printed as found.

`--legit N`: N distinct legitimate candidates more (the graded fused, unfused and partial solutions of train and test
tasks, told apart by a comment), judged on the largest count of GPUs only, in batches of `--legit-batch` through a
fresh scheduler each: every one must be judged correct, and `harness_failures` names any that is not.

Judges outlive their evaluations (drkernel.sandbox.judge_host) as the scheduler's do by default, one process started
per evaluation; `--no-judge-hosts`: a judge process per evaluation, two started. DIR/every_gpu.json holds every number and each evaluation's summary (`gpu_bench.summary`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_bench  # noqa: E402  (puts the repository on sys.path)

from drkernel.runner.supervisor import GPU_OVERLAP  # noqa: E402
from drkernel.schema import ErrorKind, EvalOptions, EvalRequest, Status  # noqa: E402

EXPECTED_BY_VARIANT = {"fused": Status.CORRECT, "unfused": Status.CORRECT, "partial": Status.CORRECT,
                       "lazy": Status.HACKED, "wrong_mask": Status.INCORRECT, "wrong_op": Status.INCORRECT,
                       "wrong_norm": Status.INCORRECT}
HARNESS_KINDS = {ErrorKind.SANDBOX_ERROR.value, ErrorKind.CORRUPT_RESULT.value, ErrorKind.EXIT.value,
                 ErrorKind.KILLED_HARNESS.value}


def distinct_batch(tasks: list, options: EvalOptions, samples: int) -> list[tuple[str, EvalRequest]]:
    """An RL step's samples, every one a distinct answer (what the result cache cannot answer)."""
    return gpu_bench.rl_shaped(tasks, options, samples, identical=1)


def legitimate_batch(count: int, options: EvalOptions, scale: float) -> list[tuple[str, EvalRequest]]:
    """`count` distinct legitimate candidates: each task's fused, unfused and partial solutions in turn, over as
    many train and test tasks as it takes, a round past the first told apart by a comment."""
    from drkernel.tasks.synthetic import generate
    from drkernel.tasks.synthetic_solutions import solutions

    if count <= 0:
        return []
    tasks = generate("train", 48, seed=1, shape_scale=scale) + generate("test", 16, seed=1, shape_scale=scale)
    legit = [(task, variant, code) for task in tasks for variant, code in solutions(task).items()
             if expected_status(f":{variant}") == Status.CORRECT]
    batch = []
    for index in range(count):
        task, variant, code = legit[index % len(legit)]
        round_ = index // len(legit)
        batch.append((f"{task.name}/{round_}:{variant}", EvalRequest(
            task.task().code, f"# round {round_}\n{code}" if round_ else code, options, task_name=task.name)))
    return batch


def expected_status(name: str) -> Status:
    """What a candidate of these batches is: its variant after ':' for a graded solution, else a level-1 kernel."""
    variant = name.rpartition(":")[2] if ":" in name else ""
    return EXPECTED_BY_VARIANT.get(variant, Status.CORRECT)


def misjudged(rows: dict[str, dict]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(harness failures, unexpected verdicts): legitimate candidates not judged correct and evaluations ended by
    the harness's own failure; the other candidates judged otherwise than their variant says."""
    failures, unexpected = [], []
    for name, row in rows.items():
        expected = expected_status(name)
        kind = (row.get("error") or "").split(":", 1)[0]
        if row["status"] == expected.value and kind not in HARNESS_KINDS:
            continue
        trace = (row.get("traceback") or "").strip().splitlines()
        entry = {"problem": name, "status": row["status"], "expected": expected.value,
                 "hack_reasons": row["hack_reasons"], "cause": row.get("error"),
                 "last_traceback_line": trace[-1] if trace else None}
        (failures if expected == Status.CORRECT or kind in HARNESS_KINDS else unexpected).append(entry)
    return failures, unexpected


def underfull_share(rows: dict[str, dict], slots: int) -> float | None:
    """The share of the running time in which fewer than `slots` evaluations ran (from each one's span)."""
    edges = sorted([(row["span_s"][0], 1) for row in rows.values() if not row["cached"]]
                   + [(row["span_s"][1], -1) for row in rows.values() if not row["cached"]])
    if not edges:
        return None
    running, last, underfull = 0, 0.0, 0.0
    for at, step in edges:
        if running < slots:
            underfull += max(0.0, at - max(last, 0.0))
        running, last = running + step, at
    return underfull / last if last > 0 else None


def compared(first: dict[str, dict], rows: dict[str, dict]) -> dict[str, Any]:
    """Verdicts that changed against the first count's run, and how far the speedups moved."""
    changed = [name for name, row in rows.items() if name in first and (
        row["status"] != first[name]["status"] or sorted(row["hack_reasons"]) != sorted(first[name]["hack_reasons"]))]
    ratios = [row["speedup"] / first[name]["speedup"] for name, row in rows.items()
              if row.get("speedup") and first.get(name, {}).get("speedup")]
    return {"verdicts_changed": changed,
            "speedup_ratio": {"median": statistics.median(ratios), "farthest": max(ratios, key=lambda r: abs(r - 1))}
            if ratios else None}


def measure(counts: list[int], batches: dict[str, list[tuple[str, EvalRequest]]], overlap: int | None,
            out_file: Path, device: str = "cuda", judge_hosts: bool = True,
            out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each batch through a fresh scheduler of each count of workers; rates, efficiency, comparisons, failures.
    Added to `out` (a new record if None) and written to `out_file` after each run, so that a run cut short keeps
    what it measured."""
    if out is None:
        out = {"counts": counts, "judge_hosts": judge_hosts, "batches": {}}
    for label, pairs in batches.items():
        if not pairs:
            continue
        runs: dict[int, dict] = {}
        for n in counts:
            run = gpu_bench.run_batch(pairs, f"every-gpu-{label}-{n}", overlap=overlap, device=device, workers=n,
                                      judge_hosts=judge_hosts)
            slots = n * (overlap or (GPU_OVERLAP if device == "cuda" else 1))
            run["underfull_share"] = underfull_share(run["problems"], slots)
            run["harness_failures"], run["unexpected_verdicts"] = misjudged(run["problems"])
            for what in ("harness_failures", "unexpected_verdicts"):
                for entry in run[what]:
                    print(f"  {what.replace('_', ' ')[:-1]} ({label}, {n} GPU(s)): {json.dumps(entry)}", flush=True)
            runs[n] = run
            out["batches"][label] = {str(k): v for k, v in runs.items()}
            out_file.write_text(json.dumps(out, indent=1))
        base = runs[counts[0]]
        for n, run in runs.items():
            run["efficiency"] = run["per_minute_running"] / (n / counts[0] * base["per_minute_running"])
            run.update(compared(base["problems"], run["problems"]))
            print(f"  {label}: {n} GPU(s) {run['per_minute_running']:.1f}/min running, efficiency "
                  f"{run['efficiency']:.2f}, underfull {run['underfull_share'] or 0:.1%}, "
                  f"{len(run['harness_failures'])} failures, {len(run['verdicts_changed'])} verdicts changed",
                  flush=True)
        out_file.write_text(json.dumps(out, indent=1))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", default="1,2,4", help="counts of GPUs, in turn (the first is the baseline)")
    parser.add_argument("--kernelbench", type=Path, default=Path(os.environ.get("DRKERNEL_KERNELBENCH", "")))
    parser.add_argument("--synthetic-n", type=int, default=16,
                        help="synthetic test tasks of the RL-shaped batch (0: none)")
    parser.add_argument("--rl-samples", type=int, default=8, help="samples per task, all distinct")
    parser.add_argument("--level1", type=int, default=20, help="level-1 problems (0: none)")
    parser.add_argument("--overlap", type=int, default=None, help="evaluations at once per GPU")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: the script's own check")
    parser.add_argument("--synthetic-scale", type=float, default=1.0)
    parser.add_argument("--legit", type=int, default=0,
                        help="distinct legitimate candidates more, on the largest count of GPUs")
    parser.add_argument("--legit-batch", type=int, default=250, help="of --legit, how many a scheduler judges")
    parser.add_argument("--judge-hosts", action=argparse.BooleanOptionalAction, default=True,
                        help="judges that outlive their evaluations (--no-judge-hosts: a judge per evaluation)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        counts = [int(n) for n in args.gpus.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--gpus takes counts separated by commas, not {args.gpus!r}")
    if not counts or min(counts) < 1:
        parser.error("--gpus needs counts of at least 1")
    if args.legit_batch < 1:
        parser.error("--legit-batch needs at least 1")
    if args.level1 and not args.kernelbench.is_file():
        parser.error("the level-1 set needs KernelBench's JSONL: --kernelbench or $DRKERNEL_KERNELBENCH (or --level1 0)")
    from drkernel.tasks.synthetic import generate

    options = dataclasses.replace(gpu_bench.OPTIONS, device=args.device)
    tasks = generate("test", args.synthetic_n, seed=0, shape_scale=args.synthetic_scale) if args.synthetic_n else []
    level1 = [(name, dataclasses.replace(request, options=options))
              for name, request in gpu_bench.kernelbench_pairs(args.kernelbench)[: args.level1]] if args.level1 else []
    args.out.mkdir(parents=True, exist_ok=True)
    measured = measure(counts, {"rl": distinct_batch(tasks, options, args.rl_samples), "level1": level1},
                       args.overlap, args.out / "every_gpu.json", args.device, args.judge_hosts)
    legit = legitimate_batch(args.legit, options, args.synthetic_scale)
    failures: list[dict[str, Any]] = []
    for start in range(0, len(legit), args.legit_batch):
        label = f"legit{start // args.legit_batch + 1}"
        measure([max(counts)], {label: legit[start:start + args.legit_batch]}, args.overlap,
                args.out / "every_gpu.json", args.device, args.judge_hosts, out=measured)
        failures += [entry for run in measured["batches"][label].values() for entry in run["harness_failures"]]
        measured["legit"] = {"evaluations": min(len(legit), start + args.legit_batch), "gpus": max(counts),
                             "harness_failures": len(failures)}
    if legit:
        (args.out / "every_gpu.json").write_text(json.dumps(measured, indent=1))
        print(f"legitimate: {len(legit)} on {max(counts)} GPU(s), {len(failures)} harness failures", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
