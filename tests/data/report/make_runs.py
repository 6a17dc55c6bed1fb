"""Writes the small recorded runs the report tests read (run it again only to change them):

  bench_gpu/       finished bench run: 5 tasks (levels 1, 2 and none), 3 samples, 3 turns, GPU-style results with
                   coverage, hacks with reasons, format errors, a generation error
  bench_cpu/       run still going: 4 tasks, 2 samples, some trajectories at turn 2, interpreter timings, no
                   summary.json, a partial last line
  train_run/       training run: metrics.jsonl (4 steps, validation at steps 2 and 4) and validation/step_4/

    PYTHONPATH=. python tests/data/report/make_runs.py
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from drkernel.rl import reward
from drkernel.schema import Environment, ErrorInfo, EvalResult, Profile

HERE = Path(__file__).resolve().parent
TASKS = [("L1/1_matmul", 1), ("L1/2_relu", 1), ("L2/3_conv_bias", 2), ("L2/4_gemm_gelu", 2), ("misc_softmax", None)]
OUTCOMES = ["correct"] * 6 + ["incorrect", "compile_error", "runtime_error", "timeout", "hacked", "format_error"]
HACKS = ["lazy_kernel", "torch_fallback", "output_caching"]


def result_for(outcome: str, rng: random.Random, gpu: bool) -> EvalResult:
    env = Environment(device="NVIDIA H100" if gpu else "cpu", interpreter=not gpu, gpu=gpu)
    coverage = round(rng.uniform(0.0, 1.0), 3)
    profile = Profile(coverage=coverage, meaningful=True) if gpu else Profile(note="no GPU: launch counts only")
    if outcome == "correct":
        speedup = round(math.exp(rng.gauss(0.1, 0.5)), 4)
        return EvalResult(status="correct", correct=True, speedup=speedup, profile=profile, environment=env)
    if outcome == "hacked":
        reason = rng.choice(HACKS)
        return EvalResult(status="hacked", hack_reasons=[reason], hack_details={reason: "test"},
                          speedup=round(rng.uniform(1.0, 5.0), 3), profile=profile, environment=env)
    if outcome == "incorrect":
        return EvalResult(status="incorrect", profile=profile, environment=env)
    kind = {"compile_error": "CompilationError", "runtime_error": "RuntimeError", "timeout": "Timeout"}[outcome]
    return EvalResult(status=outcome, error=ErrorInfo(kind=kind, message="test"), environment=env)


def write_run(folder: Path, tasks: list, samples: int, turns: int, seed: int, gpu: bool, stop_early: set,
              finished: bool) -> None:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for task, level in tasks:
        for sample in range(samples):
            for turn in range(1, turns + 1):
                if turn == turns and (task, sample) in stop_early:
                    break
                outcome = rng.choice(OUTCOMES)
                code = None if outcome == "format_error" else (
                    f"# {task} sample {sample} turn {turn}\nclass ModelNew:\n    pass\n")
                result = result_for(outcome, rng, gpu) if code else None
                lines.append({
                    "task": task, "level": level, "sample": sample, "turn": turn,
                    "messages": [{"role": "user", "content": f"optimize {task}"}],
                    "response": f"```python\n{code}```" if code else "no code here",
                    "code": code, "result": result.to_dict() if result else None,
                    "reward": reward(result) if result else 0.0,
                    "feedback": "feedback text", "context_turns": list(range(1, turn)),
                    "usage": {"prompt_tokens": 100 * turn, "completion_tokens": 50},
                    "timings": {"generation_s": 1.0, "evaluation_s": 2.0},
                    "status": result.status if result else outcome,
                    "extra_field_from_a_newer_loop": True,
                })
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if not finished:
        text += json.dumps(lines[-1])[:60]  # a line still being written
    (folder / "trajectories.jsonl").write_text(text)
    config = {"model": "test-policy", "max_turns": turns, "samples": samples, "context": "full",
              "options": {"device": "cuda" if gpu else "cpu", "min_coverage": 0.05}}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if finished:
        (folder / "summary.json").write_text(json.dumps({"trajectories": len(tasks) * samples, "turns": len(lines)}))


def write_training(folder: Path) -> None:
    rng = random.Random(7)
    folder.mkdir(parents=True, exist_ok=True)
    steps = []
    for step in range(1, 5):
        row = {
            "step": step, "reward_mean": round(0.3 + 0.1 * step + rng.uniform(-0.05, 0.05), 4),
            "reward_std": 0.2, "turn_correct": [0.3, 0.4, 0.5], "turn_fast_1": [0.1, 0.2, 0.25],
            "turn_fast_1_2": [0.05, 0.1, 0.15], "hacked_share": round(0.2 / step, 4),
            "lazy_share": round(0.1 / step, 4), "coverage_mean": 0.5, "kept_mrs": 1.0, "kept_prs": 0.9,
            "kept_void_turn": 0.95, "tokens": 1000, "time_generation_s": 10.0, "time_evaluation_s": 5.0,
            "time_update_s": 1.0,
        }
        if step % 2 == 0:
            row["validation"] = {"correct": 0.4 + 0.05 * step, "fast_1": 0.1 * step, "fast_1_2": 0.05 * step,
                                 "turn_fast_1": [0.1, 0.2], "turn_fast_1_2": [0.05, 0.1],
                                 "best_of_history_fast_1_2": 0.06 * step}
        steps.append(row)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    write_run(folder / "validation" / "step_2", TASKS[:2], 1, 2, seed=11, gpu=True, stop_early=set(), finished=True)
    write_run(folder / "validation" / "step_4", TASKS[:4], 1, 2, seed=12, gpu=True, stop_early=set(), finished=True)


if __name__ == "__main__":
    write_run(HERE / "bench_gpu", TASKS, 3, 3, seed=1, gpu=True, stop_early=set(), finished=True)
    write_run(HERE / "bench_cpu", TASKS[:4], 2, 3, seed=2, gpu=False,
              stop_early={("L1/1_matmul", 1), ("L2/3_conv_bias", 0)}, finished=False)
    write_training(HERE / "train_run")
