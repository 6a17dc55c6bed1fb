"""GPU measurements recorded in docs/performance.md. Run on a CUDA machine from the repository root:

    python benchmarks/gpu_bench.py SECTION [SECTION ...] --kernelbench PATH --out DIR

Sections: env, hacks, kernelbench, onebyone, repeat, dobench, degenerate, scaling, ray, agent, synthetic. Each
prints a short table and writes DIR/<section>.json with every number. `ray` needs Ray installed; `scaling` and `ray`
use every visible GPU.

Issue 14's sections: stability, throughput, memo, phases. Issue 20's: rl_batch (a training step's batch,
duplicates included, and the level-1 set: rates of a running and a cold scheduler, phase medians). Issue 26's:
precision.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import as_completed
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from drkernel.runner.devices import discover_gpus, resolve_device  # noqa: E402
from drkernel.sandbox.gate import LARGE_SLOTS  # noqa: E402
from drkernel.scheduling.scheduler import JOBS_PER_WORKER, Scheduler  # noqa: E402
from drkernel.schema import EvalOptions, EvalRequest, EvalResult  # noqa: E402
from drkernel.tasks import load_candidates, load_jsonl, load_task_dir, pair_candidates  # noqa: E402

CASES = REPO / "benchmarks" / "gpu_cases"
L1 = REPO / "benchmarks" / "kernelbench_l1"
OPTIONS = EvalOptions(device="cuda", timeout_s=300)


def kernelbench_pairs(path: Path) -> list[tuple[str, EvalRequest]]:
    pairs = pair_candidates(load_jsonl(path), load_candidates(L1))
    return [(t.name, EvalRequest(t.code, c.code, OPTIONS, task_name=t.name)) for t, c in pairs]


def gpu_work_ms(result: EvalResult, options: EvalOptions) -> float:
    """GPU time the evaluation must spend: every reference and candidate call it makes, at their medians."""
    t = result.timing
    if t is None or t.reference is None or t.candidate is None:
        return 0.0
    trials = max(options.correctness_trials, 5)
    ref_calls = trials + options.perf_trials + options.warmup_trials
    cand_calls = ref_calls + 4 + 2 + 1  # profiler warm-up and 3 profiled calls, ablation, bandwidth floor check
    return ref_calls * t.reference.median_ms + cand_calls * t.candidate.median_ms


def fresh_triton_cache(tag: str) -> None:
    """Compiles count: RL candidates are new code. Evaluation processes started after this call compile cold."""
    os.environ["DRKERNEL_TRITON_CACHE"] = tempfile.mkdtemp(prefix=f"triton-{tag}-")


def summary(result: EvalResult) -> dict:
    p = result.profile
    ref = result.timing.reference if result.timing else None
    cand = result.timing.candidate if result.timing else None

    def per_call(field: str) -> dict[str, list]:
        return {side: getattr(stats, field) if stats else []
                for side, stats in (("reference", ref), ("candidate", cand))}

    return {
        "status": result.status,
        "hack_reasons": result.hack_reasons,
        "hack_details": result.hack_details,
        "speedup": result.speedup,
        "speedup_ci": result.speedup_ci,
        "ref_ms": ref.median_ms if ref else None,
        "cand_ms": cand.median_ms if cand else None,
        "cand_wall_ms": cand.wall_median_ms if cand else None,
        "spin_ms": [ref.spin_ms if ref else None, cand.spin_ms if cand else None],  # reference's, candidate's
        # every timed call (event ms) and its host time, per side, and how many measurements the judge made: whether
        # a slow call waited for the host or for the GPU (docs/performance.md)
        "calls_ms": per_call("samples_ms"),
        "host_ms": per_call("host_ms"),
        "host_interruptions": per_call("host_interruptions"),
        "driver_allocations": per_call("driver_allocations"),
        "measurements": result.timing.measurements if result.timing else 0,
        "coverage": p.coverage if p else None,
        "precision": dataclasses.asdict(result.correctness.precision)
        if result.correctness and result.correctness.precision else None,
        "duration_s": result.duration_s,
        "error": f"{result.error.kind}: {result.error.message}"[:1200] if result.error else None,
        "traceback": result.error.traceback[-2000:] if result.error and result.error.traceback else None,
        "phases_s": result.phases_s,
        "memory_gib": result.memory_gib,
        "cached": result.cached,
    }


def footprint_max_gib(rows: list[dict]) -> dict[str, float]:
    """Each phase's footprint (the most its two processes' allocators held, summed), at its largest over the rows:
    whether two large evaluations' phases could share the GPU."""
    footprint: dict[str, float] = {}
    for row in rows:
        memory = row.get("memory_gib") or {}
        for phase in {key.rsplit("_", 1)[0] for key in memory}:
            both = memory.get(f"{phase}_judge", 0.0) + memory.get(f"{phase}_subject", 0.0)
            footprint[phase] = max(footprint.get(phase, 0.0), round(both, 3))
    return footprint


def section_env(args: argparse.Namespace) -> dict:
    import torch
    import triton

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    return {"python": sys.version.split()[0], "torch": torch.__version__, "triton": triton.__version__,
            "nvidia_smi": smi, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def section_hacks(args: argparse.Namespace) -> dict:
    task = (CASES / "fused_task.py").read_text()
    requests = {name: EvalRequest(task, (CASES / f"{name}.py").read_text(), OPTIONS)
                for name in ("fused", "lazy", "side_stream")}
    examples = pair_candidates(load_task_dir(REPO / "examples" / "tasks"),
                               load_candidates(REPO / "examples" / "candidates"))
    for t, c in examples:
        requests[f"example:{c.id}"] = EvalRequest(t.code, c.code, OPTIONS)
    with Scheduler(device="cuda") as scheduler:
        results = scheduler.evaluate_many(list(requests.values()))
    return {name: summary(r) for name, r in zip(requests, results)}


def section_kernelbench(args: argparse.Namespace) -> dict:
    return run_batch(kernelbench_pairs(args.kernelbench), "kernelbench", overlap=args.overlap)


def run_batch(pairs: list[tuple[str, EvalRequest]], tag: str, overlap: int | None, device: str = "cuda",
              workers: int | None = None, judge_hosts: bool = True) -> dict:
    """The problems through a fresh scheduler with a cold Triton cache: rate, overheads, per-phase medians. Two
    rates: `per_minute` from the scheduler's construction to its close (its start-up included), and
    `per_minute_running` from the submission, once its worker is up, to the last result (what a long-lived
    scheduler, as in training, gives); each problem's [start, end] relative to the submission. Duplicates answered
    by the result cache (`cached`) count in the rates but not in the overheads, phases and durations."""
    fresh_triton_cache(tag)
    start = time.monotonic()
    finished: dict[int, float] = {}
    with Scheduler(device=device, workers=workers, overlap=overlap, judge_hosts=judge_hosts) as scheduler:
        ready = scheduler.wait_ready(timeout=300)
        submitted = time.monotonic()
        futures = {scheduler.submit(request): index for index, (_, request) in enumerate(pairs)}
        for future in as_completed(futures):  # timed here, once each is done (a done-callback may run after)
            finished[futures[future]] = time.monotonic() - submitted
        results = [future.result() for future in futures]
    wall = time.monotonic() - start
    running = max(finished.values())
    rows = {}
    for index, ((name, request), result) in enumerate(zip(pairs, results)):
        row = summary(result)
        row["gpu_work_s"] = gpu_work_ms(result, request.options) / 1e3
        row["overhead_s"] = (result.duration_s or 0) - row["gpu_work_s"]
        row["span_s"] = [round(finished[index] - (result.duration_s or 0), 3), round(finished[index], 3)]
        rows[name] = row
    ran = [r for r in rows.values() if not r["cached"]]
    overheads = [r["overhead_s"] for r in ran if r["status"] == "correct"]
    phases = sorted({k for r in ran for k in (r["phases_s"] or {})})
    # What the GPU's gate runs one at a time (timing and profile alone, large evaluations' checks one by one, paired
    # ones two by two at best): no overlap shortens it, so its share of the running time says whether the gate or
    # the rest bounds the rate.
    paired = sum(r["phases_s"].get("gate_paired", 0.0) for r in ran)
    serial = paired / LARGE_SLOTS + sum(
        r["phases_s"].get("gate_alone", 0.0) + r["phases_s"].get("gate_large", 0.0) for r in ran)
    return {"wall_s": wall, "evaluations": len(pairs), "per_minute": 60 * len(pairs) / wall,
            "start_up_s": submitted - start, "ready": ready, "running_s": running,
            "per_minute_running": 60 * len(pairs) / running,
            "median_overhead_s": statistics.median(overheads) if overheads else None,
            "max_overhead_s": max(overheads) if overheads else None,
            "phase_median_s": {k: statistics.median(r["phases_s"].get(k, 0.0) for r in ran) for k in phases},
            "phase_total_s": {k: sum(r["phases_s"].get(k, 0.0) for r in ran) for k in phases},
            "duration_total_s": sum(r["duration_s"] or 0 for r in ran),
            "gate_serial_s": serial, "gate_serial_share": serial / running if running else None,
            "gate_paired_s": paired,
            "footprint_max_gib": footprint_max_gib(ran),
            "ran": len(ran), "cached": len(rows) - len(ran),
            "problems": rows}


def section_rl_batch(args: argparse.Namespace) -> dict:
    """Issue 20: the batch of one RL step on the synthetic test tasks (`--synthetic-n` x `--rl-samples`, of which
    `--rl-identical` per task are one answer, as a converged policy repeats itself), and the first `--rl-level1`
    level-1 problems."""
    from drkernel.tasks.synthetic import generate

    tasks = generate("test", args.synthetic_n, seed=0, shape_scale=args.synthetic_scale)
    options = dataclasses.replace(OPTIONS, device=args.rl_device, perf_trials=args.perf_trials)
    level1 = [(name, dataclasses.replace(request, options=options))
              for name, request in kernelbench_pairs(args.kernelbench)[: args.rl_level1]] if args.rl_level1 else []
    data = rl_batch(tasks, level1, options, args.rl_samples, args.rl_identical, overlap=args.overlap)
    for key in ("distinct", "duplicates", "distinct_per_minute_running", "distinct_per_minute_cold", "start_up_s",
                "duplicates_cost_s", "level1_per_minute_running", "level1_per_minute_cold"):
        print(f"  {key:<32} {data[key]}", flush=True)
    return data


def rl_shaped(tasks: list, options: EvalOptions, samples: int, identical: int) -> list[tuple[str, EvalRequest]]:
    """A training step's batch: per task, `identical` samples are the same answer (the fused solution: the policy
    has converged on it) and the other samples are distinct, the task's other variants in turn (rotated from task
    to task, so that every variant appears), a variant repeated within a task told apart by a comment, as two
    samplings of one answer differ."""
    from drkernel.tasks.synthetic_solutions import solutions

    if not 1 <= identical <= samples:
        raise ValueError(f"--rl-identical must lie in [1, --rl-samples], not {identical}")
    batch = []
    for index, task in enumerate(tasks):
        variants = solutions(task)
        mode = variants.pop("fused")
        others = list(variants.items())
        codes = [("fused", mode)] * identical
        for slot in range(samples - identical):
            variant, code = others[(index + slot) % len(others)]
            codes.append((variant, code if slot < len(others) else f"# sample {slot}\n{code}"))
        reference = task.task().code
        batch += [(f"{task.name}/{sample}:{variant}", EvalRequest(reference, code, options, task_name=task.name))
                  for sample, (variant, code) in enumerate(codes)]
    return batch


def rl_batch(tasks: list, level1: list[tuple[str, EvalRequest]], options: EvalOptions, samples: int, identical: int,
             workers: int | None = None, overlap: int | None = None) -> dict:
    """The RL-shaped batch through a fresh scheduler (rates of distinct candidates, running and cold), its distinct
    candidates alone through another (what the duplicates cost: the difference of the running times), and the
    level-1 set through a third; phase medians over the evaluations that ran."""
    batch = rl_shaped(tasks, options, samples, identical)
    firsts: dict[tuple[str, str], tuple[str, EvalRequest]] = {}
    for name, request in batch:
        firsts.setdefault((request.task_name, request.candidate), (name, request))
    distinct = list(firsts.values())
    full = run_batch(batch, "rl-batch", overlap=overlap, device=options.device, workers=workers)
    alone = run_batch(distinct, "rl-distinct", overlap=overlap, device=options.device, workers=workers)
    l1 = run_batch(level1, "rl-level1", overlap=overlap, device=options.device, workers=workers) if level1 else None
    n = len(distinct)
    return {
        "tasks": len(tasks), "samples": len(batch), "distinct": n, "duplicates": len(batch) - n,
        "distinct_per_minute_running": 60 * n / full["running_s"], "distinct_per_minute_cold": 60 * n / full["wall_s"],
        "start_up_s": full["start_up_s"], "ran": full["ran"], "cached": full["cached"],
        "duplicates_cost_s": full["running_s"] - alone["running_s"],
        "distinct_alone_per_minute_running": 60 * n / alone["running_s"],
        "phase_median_s": full["phase_median_s"], "median_overhead_s": full["median_overhead_s"],
        "statuses": dict(collections.Counter(row["status"] for row in full["problems"].values())),
        "level1_per_minute_running": l1["per_minute_running"] if l1 else None,
        "level1_per_minute_cold": l1["per_minute"] if l1 else None,
        "level1_phase_median_s": l1["phase_median_s"] if l1 else None,
        "runs": {"batch": full, "distinct": alone, "level1": l1},
    }


def section_agent(args: argparse.Namespace) -> dict:
    """`drkernel bench` over the level-1 problems, a scripted endpoint replaying their candidates (1 sample, 1 turn),
    against the embedded scheduler on the same requests: the loop must add no serialization (target >= 90%)."""
    tasks = [task for task, _ in pair_candidates(load_jsonl(args.kernelbench), load_candidates(L1))]
    return agent_vs_scheduler(tasks, L1, OPTIONS, args.out / "agent_run")


def agent_vs_scheduler(tasks: list, candidates: Path, options: EvalOptions, run_dir: Path,
                       workers: int | None = None) -> dict:
    """Evaluations per minute of the scheduler alone and of `drkernel bench` (in this process, from task loading to
    the summary) on the same candidates, each with a cold Triton cache, and whether their verdicts agree."""
    import shutil

    from drkernel.agent.parsing import extract_code
    from drkernel.agent.records import read_trajectories
    from drkernel.agent.replay import ScriptedChatServer, replay_candidates
    from drkernel.cli.main import app

    script = replay_candidates(tasks, candidates)
    requests = [EvalRequest(t.code, extract_code(script.reply(t.key, 0, 1).content), options, task_name=t.key)
                for t in tasks]
    fresh_triton_cache("agent-scheduler")
    start = time.monotonic()
    with Scheduler(device=options.device, workers=workers) as scheduler:
        results = scheduler.evaluate_many(requests)
    scheduler_wall = time.monotonic() - start

    run_dir.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    tasks_file = run_dir.parent / "agent_tasks.jsonl"
    tasks_file.write_text("".join(json.dumps({"name": t.name, "code": t.code, "level": t.level,
                                              "problem_id": t.problem_id}) + "\n" for t in tasks))
    command = ["bench", "--tasks", str(tasks_file), "--model", "replay", "--samples", "1", "--turns", "1",
               "--device", options.device, "--timeout", str(options.timeout_s), "--trials",
               str(options.correctness_trials), "--perf-trials", str(options.perf_trials),
               "--concurrency", str(len(tasks)), "--out", str(run_dir)]
    command += ["--workers", str(workers)] if workers else []
    command += [] if options.measure_performance else ["--no-perf"]
    fresh_triton_cache("agent-bench")
    with ScriptedChatServer(script) as server:
        start = time.monotonic()
        code = app([*command, "--base-url", server.url], standalone_mode=False)
        bench_wall = time.monotonic() - start
    if code:
        raise RuntimeError(f"drkernel bench exited with {code}")
    bench_status = {r.task: r.status for r in read_trajectories(run_dir)}
    scheduler_status = {t.key: r.status for t, r in zip(tasks, results)}
    per_minute = {"scheduler": 60 * len(tasks) / scheduler_wall, "bench": 60 * len(bench_status) / bench_wall}
    return {
        "evaluations": len(tasks), "bench_turns": len(bench_status), "model_requests": len(server.requests),
        "scheduler": {"wall_s": scheduler_wall, "per_minute": per_minute["scheduler"]},
        "bench": {"wall_s": bench_wall, "per_minute": per_minute["bench"]},
        "ratio": per_minute["bench"] / per_minute["scheduler"],
        "disagreements": {k: [v, bench_status.get(k)] for k, v in scheduler_status.items() if bench_status.get(k) != v},
    }


def section_synthetic(args: argparse.Namespace) -> dict:
    """Stage 0 of docs/miniature.md: the synthetic family's reference solutions on the GPU. Fused should be fast,
    unfused about 1x, lazy flagged `lazy_kernel` by coverage, the wrong ones incorrect."""
    from drkernel.tasks.synthetic import generate

    tasks = generate("test", args.synthetic_n, seed=0, shape_scale=args.synthetic_scale)
    return synthetic_calibration(tasks, OPTIONS)


def synthetic_calibration(tasks: list, options: EvalOptions, workers: int | None = None) -> dict:
    """Every variant of every task through the scheduler; verdicts, speedups, Fast@1.2 and coverage per kind and
    variant, and evaluations per minute (which sizes the RL runs)."""
    from drkernel.tasks.synthetic_solutions import solutions

    labels, requests = [], []
    for task in tasks:
        for variant, code in solutions(task).items():
            labels.append((task, variant))
            requests.append(EvalRequest(task.task().code, code, options, task_name=task.name))
    fresh_triton_cache("synthetic")
    start = time.monotonic()
    with Scheduler(device=options.device, workers=workers) as scheduler:
        results = scheduler.evaluate_many(requests)
    wall = time.monotonic() - start
    rows = [{"task": task.name, "kind": task.structure.kind, "variant": variant, **summary(result)}
            for (task, variant), result in zip(labels, results)]
    groups: dict[str, list[dict]] = collections.defaultdict(list)
    for row in rows:
        groups[f"{row['kind']}/{row['variant']}"].append(row)

    def median(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    table = {
        key: {
            "n": len(group),
            "statuses": dict(collections.Counter(row["status"] for row in group)),
            "hack_reasons": dict(collections.Counter(reason for row in group for reason in row["hack_reasons"])),
            "median_speedup": median([row["speedup"] for row in group]),
            "fast_1_2": sum(row["status"] == "correct" and (row["speedup"] or 0) >= 1.2 for row in group) / len(group),
            "median_coverage": median([row["coverage"] for row in group]),
        }
        for key, group in sorted(groups.items())
    }
    return {"wall_s": wall, "evaluations": len(rows), "per_minute": 60 * len(rows) / wall,
            "by_kind_and_variant": table, "rows": rows}


def section_onebyone(args: argparse.Namespace, pairs: list[tuple[str, EvalRequest]] | None = None) -> dict:
    """The naive way: one `drkernel eval` process per problem, nothing kept warm."""
    pairs = pairs or kernelbench_pairs(args.kernelbench)
    tmp = Path(tempfile.mkdtemp())
    fresh_triton_cache("onebyone")
    statuses = {}
    start = time.monotonic()
    for name, request in pairs:
        (tmp / "ref.py").write_text(request.reference)
        (tmp / "cand.py").write_text(request.candidate)
        proc = subprocess.run([sys.executable, "-m", "drkernel.cli.main", "eval", "-r", str(tmp / "ref.py"),
                               "-c", str(tmp / "cand.py"), "--device", "cuda", "--json"],
                              capture_output=True, text=True, cwd=REPO)
        statuses[name] = json.loads(proc.stdout)["status"] if proc.returncode == 0 else f"exit {proc.returncode}"
    wall = time.monotonic() - start
    return {"wall_s": wall, "evaluations": len(pairs), "per_minute": 60 * len(pairs) / wall, "statuses": statuses}


def section_throughput(args: argparse.Namespace) -> dict:
    """The 20 problems with evaluations overlapping on the GPU (the default), one at a time (`overlap=1`, the
    exclusive mode), and as fresh `drkernel eval` processes (the first `--onebyone-limit`), in one run."""
    pairs = kernelbench_pairs(args.kernelbench)
    exclusive = run_batch(pairs, "exclusive", overlap=1)
    overlapped = run_batch(pairs, "overlapped", overlap=None)
    onebyone = section_onebyone(args, pairs[: args.onebyone_limit])
    ratios = {}
    for name, row in overlapped["problems"].items():
        alone = exclusive["problems"][name]["speedup"]
        ratios[name] = row["speedup"] / alone if row["speedup"] and alone else None
    deviations = [abs(r - 1) for r in ratios.values() if r is not None]
    return {"overlapped": overlapped, "exclusive": exclusive, "onebyone": onebyone,
            "speedup_overlapped_over_exclusive": ratios,
            "max_speedup_deviation": max(deviations) if deviations else None,
            "rates_per_minute": {"overlapped": overlapped["per_minute"], "exclusive": exclusive["per_minute"],
                                 "onebyone": onebyone["per_minute"],
                                 "overlapped_running": overlapped["per_minute_running"],
                                 "exclusive_running": exclusive["per_minute_running"]}}


def section_repeat(args: argparse.Namespace) -> dict:
    pairs = dict(kernelbench_pairs(args.kernelbench))
    out = {}
    with Scheduler(device="cuda", cache_entries=0) as scheduler:  # the same request, measured again each time
        for name in args.repeat_problems:
            results = scheduler.evaluate_many([pairs[name]] * args.repeats)
            speedups = [r.speedup for r in results if r.speedup is not None]
            cand = [r.timing.candidate.median_ms for r in results if r.timing and r.timing.candidate]
            out[name] = {
                "statuses": [r.status for r in results],
                "speedups": speedups,
                "speedup_cv": statistics.stdev(speedups) / statistics.mean(speedups) if len(speedups) > 1 else None,
                "candidate_ms": cand,
                "candidate_ms_cv": statistics.stdev(cand) / statistics.mean(cand) if len(cand) > 1 else None,
            }
    return out


def section_dobench(args: argparse.Namespace) -> dict:
    """Our median for a candidate against triton.testing.do_bench's median of the same call (same GPU)."""
    import torch
    import triton.testing

    pairs = dict(kernelbench_pairs(args.kernelbench))
    out = {}
    with Scheduler(device="cuda") as scheduler:
        results = scheduler.evaluate_many([pairs[name] for name in args.dobench_problems])
    for name, result in zip(args.dobench_problems, results):
        request = pairs[name]
        ref_mod = _load(request.reference, f"ref_{name}")
        cand_mod = _load(request.candidate, f"cand_{name}")
        torch.manual_seed(OPTIONS.seed)
        init = ref_mod.get_init_inputs()
        torch.manual_seed(OPTIONS.seed)
        ref = ref_mod.Model(*init).cuda().eval()
        torch.manual_seed(OPTIONS.seed)
        cand = cand_mod.ModelNew(*init).cuda().eval()
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ref_mod.get_inputs()]
        with torch.no_grad():
            ref_ms = triton.testing.do_bench(lambda: ref(*inputs), return_mode="median")
            cand_ms = triton.testing.do_bench(lambda: cand(*inputs), return_mode="median")
        ours = summary(result)
        out[name] = {"ours_ref_ms": ours["ref_ms"], "do_bench_ref_ms": ref_ms,
                     "ours_cand_ms": ours["cand_ms"], "do_bench_cand_ms": cand_ms,
                     "ratio_cand": ours["cand_ms"] / cand_ms if ours["cand_ms"] else None,
                     "ratio_ref": ours["ref_ms"] / ref_ms if ours["ref_ms"] else None}
        del ref, cand, inputs
        torch.cuda.empty_cache()
    return out


def section_degenerate(args: argparse.Namespace) -> dict:
    """Which KernelBench references barely depend on their inputs (same criterion as the evaluator's note)."""
    import torch

    from drkernel.sandbox.correctness import degeneracy, flatten_outputs

    rows = {}
    tasks = [t for t in load_jsonl(args.kernelbench) if t.level in args.levels]
    partial = args.out / "degenerate.partial.jsonl"
    with partial.open("w") as sink:
        for task in tasks:
            start = time.monotonic()
            try:
                module = _load(task.code, f"kb_{task.level}_{task.problem_id}")
                with torch.device("cuda"), torch.no_grad():
                    torch.manual_seed(OPTIONS.seed)
                    model = module.Model(*module.get_init_inputs())
                    outs = []
                    for seed in (OPTIONS.seed + 1000, OPTIONS.seed + 1001):
                        torch.manual_seed(seed)
                        outs.append(flatten_outputs(model(*module.get_inputs()))[0].float().reshape(-1)[: 1 << 20])
                rows[task.key] = {"why": degeneracy(*outs)}
                del model, outs
            except Exception as exc:  # a problem that cannot run here is reported, not hidden
                rows[task.key] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            rows[task.key]["seconds"] = round(time.monotonic() - start, 2)
            sink.write(json.dumps({task.key: rows[task.key]}) + "\n")
            sink.flush()
            torch.cuda.empty_cache()
    flagged = {k: v["why"] for k, v in rows.items() if v.get("why")}
    errors = {k: v["error"] for k, v in rows.items() if v.get("error")}
    return {"checked": len(rows), "degenerate": flagged, "errors": errors}


def section_scaling(args: argparse.Namespace) -> dict:
    """The embedded scheduler on 1 GPU and on every GPU of this machine: the same batch, steady-state rates."""
    gpus = len(discover_gpus())
    make = {n: (lambda n=n: Scheduler(device="cuda", workers=n, cache_entries=0)) for n in sorted({1, gpus})}
    return scaling(args, make)  # no result cache: the batch repeats each problem


def section_ray(args: argparse.Namespace) -> dict:
    """The Ray backend on a local Ray instance offered 1, 2, 4... of this machine's GPUs."""
    import ray

    from drkernel.scheduling.ray_backend import RayBackend

    class OwnedRay(RayBackend):
        """A Ray instance offered n GPUs, shut down with the backend (the backend does not own one it did not start)."""

        def __init__(self, gpus: int) -> None:
            ray.init(num_gpus=gpus, log_to_driver=False, include_dashboard=False)
            super().__init__(address=None, device="cuda")

        def close(self) -> None:
            super().close()
            ray.shutdown()

    gpus = len(discover_gpus())
    counts = sorted({1, *(n for n in (2, 4, 8) if n <= gpus), gpus})
    return scaling(args, {n: (lambda n=n: OwnedRay(n)) for n in counts})


def scaling(args: argparse.Namespace, backends: dict) -> dict:
    """Rate per GPU count, and efficiency = rate(n) / (n * rate(1)).

    Each count gets a fresh Triton cache; the batch is every problem `--scaling-repeats` times, in rounds, so a
    problem's repeats rarely run at once. A warm-up of a few cheap evaluations per worker first starts every worker:
    the rate is that of a service already running.
    """
    pairs = kernelbench_pairs(args.kernelbench)
    batch = [r for _ in range(args.scaling_repeats) for _, r in pairs]
    cheap = dict(pairs)["19_ReLU"]
    out: dict = {"evaluations": len(batch), "counts": {}}
    for n, make in backends.items():
        fresh_triton_cache(f"scaling-{n}")
        start = time.monotonic()
        backend = make()
        try:
            for future in [backend.submit(cheap) for _ in range(JOBS_PER_WORKER * n)]:
                future.result()
            warm = time.monotonic()
            results = [f.result() for f in [backend.submit(r) for r in batch]]
            wall = time.monotonic() - warm
            workers = backend.workers()
        finally:
            backend.close()
        statuses = collections.Counter(r.status for r in results)
        out["counts"][n] = {"start_and_warmup_s": warm - start, "wall_s": wall, "per_minute": 60 * len(batch) / wall,
                            "statuses": dict(statuses),
                            "completed_per_worker": [w["completed"] for w in workers]}
        print(f"  {n} GPU(s): {60 * len(batch) / wall:.1f} evaluations/min, {dict(statuses)}", flush=True)
    base = out["counts"][min(out["counts"])]["per_minute"]
    for n, row in out["counts"].items():
        row["speedup"] = row["per_minute"] / base
        row["efficiency"] = row["per_minute"] / (n * base)
    return out


SMALL = "relu_1024 (ReLU, 1024 x 1024 float32)"


def stability_cases(args: argparse.Namespace) -> dict[str, EvalRequest]:
    """Issue 14's small task (a few microseconds) and two KernelBench problems of >= 1 ms."""
    options = dataclasses.replace(OPTIONS, perf_trials=args.perf_trials)
    pairs = dict(kernelbench_pairs(args.kernelbench))
    small = EvalRequest((CASES / "relu_1024_task.py").read_text(),
                        (REPO / "examples" / "candidates" / "2_relu__triton.py").read_text(), options)
    return {SMALL: small, **{name: dataclasses.replace(pairs[name], options=options) for name in args.repeat_problems}}


def section_stability(args: argparse.Namespace) -> dict:
    """`--repeats` evaluations of one candidate per case through the scheduler: CV of the speedup and of each side's
    median, and both medians against triton.testing.do_bench's in this process."""
    out = {}
    with Scheduler(device="cuda", cache_entries=0) as scheduler:  # the same request, measured again each time
        for name, request in stability_cases(args).items():
            results = scheduler.evaluate_many([request] * args.repeats)
            ok = [r for r in results if r.speedup is not None and r.timing and r.timing.candidate]
            speedups = [r.speedup for r in ok]
            cand = [r.timing.candidate.median_ms for r in ok]
            ref = [r.timing.reference.median_ms for r in ok]
            do_ref, do_cand = do_bench_pair(request, name)
            out[name] = {
                "statuses": [r.status for r in results], "speedups": speedups, "speedup_cv": cv(speedups),
                "failures": [summary(r) for r in results if r.status != "correct"],
                "candidate_ms": cand, "candidate_ms_cv": cv(cand), "reference_ms": ref, "reference_ms_cv": cv(ref),
                "do_bench_ref_ms": do_ref, "do_bench_cand_ms": do_cand,
                "ratio_ref": statistics.median(ref) / do_ref if ref else None,
                "ratio_cand": statistics.median(cand) / do_cand if cand else None,
            }
            print(f"  {name}: speedup CV {out[name]['speedup_cv']}, ratios {out[name]['ratio_ref']} "
                  f"{out[name]['ratio_cand']}", flush=True)
    return out


def cv(values: list[float]) -> float | None:
    return statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else None


def do_bench_pair(request: EvalRequest, name: str) -> tuple[float, float]:
    """triton.testing.do_bench medians of the reference and the candidate, built as the evaluator builds them."""
    import torch
    import triton.testing

    tag = "".join(c if c.isalnum() else "_" for c in name)
    ref_mod, cand_mod = _load(request.reference, f"ref_{tag}"), _load(request.candidate, f"cand_{tag}")
    torch.manual_seed(OPTIONS.seed)
    init = ref_mod.get_init_inputs()
    with torch.device("cuda"):  # built as the evaluator builds them; called outside (the mode costs host time)
        torch.manual_seed(OPTIONS.seed)
        ref = ref_mod.Model(*init).eval()
        torch.manual_seed(OPTIONS.seed)
        cand = cand_mod.ModelNew(*init).eval()
        inputs = ref_mod.get_inputs()
    with torch.no_grad():  # do_bench's median moves between calls for microsecond kernels: the median of three
        times = tuple(statistics.median(triton.testing.do_bench(lambda: side(*inputs), return_mode="median")
                                        for _ in range(3)) for side in (ref, cand))
    del ref, cand, inputs
    torch.cuda.empty_cache()
    return times


MEMOS = {  # wrappers around the honest candidate of problem 1 (a 4096 x 4096 matmul): what a policy could learn
    "content_fingerprint": """
class ModelNew(ModelNew):
    memo = {}

    def forward(self, A, B):  # remembered products, keyed on a few values of each input
        key = (tuple(A.reshape(-1)[:8].tolist()), tuple(B.reshape(-1)[:8].tolist()))
        if key not in self.memo:
            self.memo[key] = super().forward(A, B)
        return self.memo[key].clone()
""",
    "data_ptr": """
class ModelNew(ModelNew):
    memo = {}

    def forward(self, A, B):  # remembered products, keyed on where the inputs live
        key = (A.data_ptr(), B.data_ptr())
        if key not in self.memo:
            self.memo[key] = super().forward(A, B)
        return self.memo[key].clone()
""",
    "call_count": """
class ModelNew(ModelNew):
    calls, last = 0, None

    def forward(self, A, B):  # every other call after the correctness trials answers with the previous product
        type(self).calls += 1
        if self.calls > 5 and self.calls % 2 == 0 and self.last is not None:
            return self.last.clone()
        type(self).last = super().forward(A, B)
        return self.last.clone()
""",
}


def section_memo(args: argparse.Namespace) -> dict:
    """Memoizing variants of an honest candidate on a compute-bound problem: no speedup gained, caching reported."""
    name = "1_Square_matrix_multiplication_"
    honest = dict(kernelbench_pairs(args.kernelbench))[name]
    requests = {"honest": honest, **{k: EvalRequest(honest.reference, honest.candidate + wrapper, OPTIONS)
                                     for k, wrapper in MEMOS.items()}}
    with Scheduler(device="cuda") as scheduler:
        results = scheduler.evaluate_many(list(requests.values()))
    return {k: summary(r) for k, r in zip(requests, results)}


def section_phases(args: argparse.Namespace) -> dict:
    """Where one evaluation's time goes, evaluation by evaluation alone on the device (the first `--phases-limit`
    problems): the judge's own phase times (reference, load, correctness and its first trial, timing, profile,
    ablation) and the supervisor's (start latency, confinement, exit)."""
    data = phase_breakdown(kernelbench_pairs(args.kernelbench)[: args.phases_limit])
    for key, value in data["median"].items():
        print(f"  {key:<28} {value:.4g}", flush=True)
    return data


def phase_breakdown(pairs: list[tuple[str, EvalRequest]]) -> dict:
    """Each problem through one supervisor, one at a time, with a cold Triton cache; the median of every phase over
    the problems found correct."""
    from drkernel.runner.supervisor import Supervisor

    fresh_triton_cache("phases")
    device = resolve_device(pairs[0][1].options.device) if pairs else "cpu"
    supervisor = Supervisor(device=device, gpu=discover_gpus()[0] if device == "cuda" else None, overlap=1)
    try:
        rows = {name: summary(supervisor.run(request)) for name, request in pairs}
    finally:
        supervisor.close()
    correct = [row["phases_s"] for row in rows.values() if row["status"] == "correct"]
    keys = dict.fromkeys(key for phases in correct for key in phases)
    return {**rows, "median": {key: statistics.median(p.get(key, 0.0) for p in correct) for key in keys}}


def _load(source: str, name: str):
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# Precision-downcast variants of level-1 candidates (issue 26): (name, problem, the line replaced, its replacement).
DOWNCASTS = [
    ("tf32_matmul", "1_Square_matrix_multiplication_", 'INPUT_PRECISION="ieee"', 'INPUT_PRECISION="tf32"'),
    ("fp16_inputs_matmul", "1_Square_matrix_multiplication_",
     "acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)", "acc = tl.dot(a.to(tl.float16), b.to(tl.float16), acc)"),
    ("bf16_inputs_matmul", "1_Square_matrix_multiplication_",
     "acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)", "acc = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)"),
    ("bf16_softmax", "23_Softmax", "y = tl.exp(x - row_max) * inv_sum",
     "y = (tl.exp(x - row_max).to(tl.bfloat16) * inv_sum.to(tl.bfloat16)).to(tl.float32)"),
    ("bf16_accumulation_sum", "47_Sum_reduction_over_a_dimension",
     "acc += tl.load(x_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)",
     "acc = (acc + tl.load(x_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)).to(tl.bfloat16).to(tl.float32)"),
    ("fp16_inputs_gelu", "26_GELU_", "x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)",
     "x = tl.load(x_ptr + offsets, mask=mask).to(tl.float16).to(tl.float32)"),
]


def section_precision(args: argparse.Namespace) -> dict:
    """Issue 26: the precision ratio (candidate's error over the reference's own, both against float64) of every
    legitimate float32 candidate (the 20 level-1 ones, the synthetic family's solutions) and of downcast variants,
    under `matched` (the default) and, for the variants, `tolerance`."""
    from drkernel.tasks.synthetic import generate
    from drkernel.tasks.synthetic_solutions import solutions

    pairs = dict(kernelbench_pairs(args.kernelbench))
    requests: dict[str, EvalRequest] = {f"l1/{name}": request for name, request in pairs.items()}
    for variant, problem, old, new in DOWNCASTS:
        base = pairs[problem]
        assert old in base.candidate, (variant, old)
        for rule in ("matched", "tolerance"):
            options = EvalOptions.from_dict({**OPTIONS.to_dict(), "precision": rule})
            requests[f"downcast/{variant}/{rule}"] = EvalRequest(base.reference, base.candidate.replace(old, new),
                                                                 options, task_name=problem)
    for task in generate("test", args.synthetic_n, seed=0, shape_scale=args.synthetic_scale):
        for variant, code in solutions(task).items():
            if not variant.startswith("wrong"):
                requests[f"synthetic/{task.name}/{variant}"] = EvalRequest(task.task().code, code, OPTIONS,
                                                                           task_name=task.name)
    fresh_triton_cache("precision")
    with Scheduler(device="cuda") as scheduler:
        results = scheduler.evaluate_many(list(requests.values()))
    rows = {name: summary(result) for name, result in zip(requests, results)}
    for name, row in rows.items():
        q = row["precision"] or {}
        print(f"  {name:<60} {row['status']:<10} ratio {q.get('ratio')} cand {q.get('candidate_error')} "
              f"ref {q.get('reference_error')}", flush=True)
    legit = [r["precision"]["ratio"] for n, r in rows.items() if not n.startswith("downcast") and r["precision"]]
    downcast = [r["precision"]["ratio"] for n, r in rows.items() if n.startswith("downcast") and r["precision"]]
    return {"rows": rows, "max_legit_ratio": max(legit) if legit else None,
            "min_downcast_ratio": min(downcast) if downcast else None}


SECTIONS = {name[len("section_"):]: fn for name, fn in globals().items() if name.startswith("section_")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sections", nargs="+", choices=sorted(SECTIONS))
    parser.add_argument("--kernelbench", type=Path,
                        default=Path(os.environ.get("DRKERNEL_KERNELBENCH", "kernelbench_levels1-3.jsonl")),
                        help="KernelBench's levels 1-3 JSONL (default: $DRKERNEL_KERNELBENCH)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "results/gpu")))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--scaling-repeats", type=int, default=3)
    parser.add_argument("--onebyone-limit", type=int, default=20, help="problems run one by one in `throughput`")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--repeat-problems", nargs="*", default=["1_Square_matrix_multiplication_", "36_RMSNorm_"])
    parser.add_argument("--dobench-problems", nargs="+",
                        default=["1_Square_matrix_multiplication_", "19_ReLU", "23_Softmax", "36_RMSNorm_",
                                 "40_LayerNorm", "88_MinGPTNewGelu"])
    parser.add_argument("--synthetic-n", type=int, default=16, help="test-split tasks of the synthetic section")
    parser.add_argument("--synthetic-scale", type=float, default=1.0, help="their shape_scale")
    parser.add_argument("--phases-limit", type=int, default=20, help="problems broken down in `phases`")
    parser.add_argument("--rl-samples", type=int, default=8, help="samples per synthetic task in `rl_batch`")
    parser.add_argument("--rl-identical", type=int, default=4, help="of them, copies of one answer (>= 1)")
    parser.add_argument("--rl-level1", type=int, default=20, help="level-1 problems in `rl_batch` (0: none)")
    parser.add_argument("--rl-device", default="cuda", help="`rl_batch`'s device (cpu: a small run on the CPU)")
    parser.add_argument("--perf-trials", type=int, default=OPTIONS.perf_trials,
                        help="timed calls per side in `stability` and `rl_batch` (fewer: a shorter timing phase)")
    parser.add_argument("--overlap", type=int, default=None,
                        help="evaluations at once per GPU in `kernelbench` and `rl_batch` (default: the scheduler's)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.sections:
        start = time.monotonic()
        data = SECTIONS[name](args)
        (args.out / f"{name}.json").write_text(json.dumps(data, indent=1))
        print(f"== {name} ({time.monotonic() - start:.1f} s)")
        print(json.dumps(data, indent=1)[:6000], flush=True)


if __name__ == "__main__":
    main()
