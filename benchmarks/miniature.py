"""The miniature reproduction of Dr. Kernel, one command per stage (docs/miniature.md).

    python benchmarks/miniature.py STAGE... [--profile gpu|study|cpu] [--root runs/mini] [--base GGUF] [--gpus N]
                                            [--time-limit-s S] [--policies sft grpo trloo recipe recipe-s1 ...]
                                            [--single-turn SHARES] [--first-turn SHARES] [--sft-args ARGS]
                                            [--bench-args ARGS]
                                            [--rl-set KEY=VALUE ...] [--whole-replicates]

Stages, in order (`all` runs them all):
  splits    the train / validation / test splits (`drkernel synth`; seeded, seconds)
  base      the pretrained policy: `--base` (SmolLM2-135M-Instruct's GGUF on the GPU, `drkernel pretrained fetch`)
            dequantised once into ROOT/base (`drkernel pretrained convert`); the cpu profile may go without one
            and then builds a tiny policy from scratch in the sft stage
  mix       the SFT mix (drkernel.train.synthetic_sft; its two-turn rows are judged by KernelGym)
  sft       the cold-start SFT (drkernel.train.sft) from ROOT/base -> ROOT/sft/final: on the GPU every weight
            trains (a LoRA adapter did not learn the fused kernels, docs/miniature.md), so the policy (269 MB) is
            rebuilt from its seeds on each new machine, 200 s; the CPU profile trains a LoRA adapter; `sft-sN` is
            the SFT with seed N -> ROOT/sft-sN/final, the start of every RL replicate N with --whole-replicates
  rl        (b) GRPO, (c) TRLOO, (d) TRLOO + PR + PRS, (e) `recipemrs`, (d) with MRS, same budget each
            (`drkernel train`, LoRA adapters over the SFT policy) -> ROOT/rl/NAME; with validation, each validated
            policy is kept and the later stages take the one chosen on the validation split (drkernel.train.selection)
  probe     each policy's first answers on the first train tasks, the RL runs' prompts (`drkernel bench`, one turn,
            the same seeds): the SFT policy's before RL spends GPU time (does it sample the kinds the recipe
            rewards?), an RL policy's after its run (what the run moved, prompts held fixed) -> ROOT/probe/NAME
  bench     the SFT policy (a) and the three RL policies on the test split (`drkernel bench`) -> ROOT/bench/NAME
  stts      (a), (d) and (e) over more turns, topk context -> ROOT/stts/NAME
  transfer  every policy on the KernelBench level-1 problems of the same kinds -> ROOT/transfer/NAME
  pack      each RL run's chosen policy (a LoRA adapter) with a manifest of sizes and sha256 -> ROOT/pack
  report    `drkernel report` over each stage's run folders, the SFT policy's first (the differences table sets
            each policy against it) -> ROOT/report/STAGE

Every RL policy is a LoRA adapter of a few MB over the SFT policy (`hf:` merges the chain), so what a GPU machine must
hand back for a later run to go on is small (docs/miniature.md).

Every step is a `drkernel` (or `python -m drkernel...`) command line, printed before it runs; `--dry-run` only
prints them. A stage skips what is already done and continues what a killed run left (`drkernel train --resume`
from the last checkpoint, `drkernel bench --resume`), so a stage longer than a machine's time limit is the same
command run again. With `--gpus N` (N >= 1) the per-policy stages asked for together (rl, probe, bench, stts, transfer)
are one pool of runs, each a process alone on one GPU (of CUDA_VISIBLE_DEVICES where it is set) with its own
embedded evaluator: a GPU whose run ended takes the next run, in stage order, whose policy exists (on four GPUs
the SFT policy's bench runs while the three RL runs train, and each RL policy's bench starts when its run ends).
With `--gpus 0` they run one after another in this process (the CPU profile, the test suite). `--time-limit-s`
stops the processes still running at that time (their checkpoints stay) and exits 3, to rerun later.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import importlib.util
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # drkernel from this checkout, also where it is not installed (the GPU machine)
from drkernel.train.selection import select_policy  # noqa: E402  (standard library only)


def _load_beside(stem: str) -> ModuleType:
    """benchmarks/STEM.py as module STEM (registered, so its dataclasses find their module), however this script
    was loaded."""
    spec = importlib.util.spec_from_file_location(stem, Path(__file__).resolve().parent / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module
    spec.loader.exec_module(module)
    return module


process_pool = _load_beside("process_pool")
CLI, Job, Step, ProcessPool, missing = (process_pool.CLI, process_pool.Job, process_pool.Step,
                                        process_pool.ProcessPool, process_pool.missing)
STAGES = ("splits", "base", "mix", "sft", "rl", "probe", "bench", "stts", "transfer", "pack", "report")
# (name, settings that differ): the ablations of stage 2, same budget each; `grpostd` is GRPO divided by the std,
# asked for by name only (`grpo` without it is TRLOO up to a constant Adam cancels: docs/miniature.md), and so is
# `recipemrs`, the recipe with MRS on (the study's (e): sampling from a bf16 copy, training and sampling differ)
RL_RUNS = (
    ("grpo", ("advantage_estimator=grpo", "profiling_reward=false", "prs=false")),
    ("trloo", ("advantage_estimator=trloo", "profiling_reward=false", "prs=false")),
    ("recipe", ("advantage_estimator=trloo", "profiling_reward=true", "prs=true")),
    ("grpostd", ("advantage_estimator=grpo_std", "profiling_reward=false", "prs=false")),
    ("recipemrs", ("advantage_estimator=trloo", "profiling_reward=true", "prs=true", "mrs=true")),
)
POLICIES = ("sft",) + tuple(name for name, _ in RL_RUNS)
DEFAULT_POLICIES = ("sft", "grpo", "trloo", "recipe")  # the (a) to (d)
STTS_POLICIES = ("sft", "recipe", "recipemrs")  # (a), (d) and (e)
REPLICATE = "-s"  # `recipe-s1`: a replicate of the recipe's run with seed 1, in its own folder; `sft-s1`: the SFT
INCOMPLETE = 3  # exit status: the time limit stopped runs that a rerun continues
PER_POLICY = ("rl", "probe", "bench", "stts", "transfer")  # the stages with a run per policy


def ablation(name: str) -> tuple[str, int | None]:
    """A policy's name as (its run, the replicate's seed): `recipe` -> ("recipe", None), `recipe-s1` -> ("recipe", 1),
    `sft-s1` -> ("sft", 1) (one run of the recipe lifted the policy and the next did not: one run a setting cannot
    tell an effect from its seed)."""
    run, _, seed = name.partition(REPLICATE)
    if run not in POLICIES or (seed and not seed.isdigit()) or (REPLICATE in name and not seed):
        raise ValueError(f"{name!r} is not a policy: one of {', '.join(POLICIES)}, or one with a replicate's seed, "
                         f"e.g. recipe{REPLICATE}1")
    return run, int(seed) if seed else None


def _policy(name: str) -> str:
    try:
        ablation(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return name


@dataclass(frozen=True)
class Profile:
    """Sizes of one version of the pipeline: `gpu` is the reproduction, `cpu` the tiny one the test suite runs."""

    device: str
    shape_scale: float
    n_train: int
    n_validation: int
    n_test: int
    needs_base: bool  # the GPU reproduction starts from a pretrained policy; the CPU one may build a tiny one
    sft_tasks: int
    sft_multi_turn_tasks: int
    sft_single_turn: str | None  # the single-turn rows' shares (synthetic_sft's --single-turn); None: its default
    sft_first_turn: str | None  # the two-turn rows' first answers (synthetic_sft's --first-turn); None: its default
    sft_args: tuple[str, ...]  # the policy-shape arguments apply only without a base
    probe_tasks: int  # train tasks 1..N
    probe_samples: int
    rl_config: str
    bench_turns: int
    bench_samples: int
    max_tokens: int
    stts_turns: int
    stts_context: str
    stts_samples: int
    transfer_tasks: str
    transfer_args: tuple[str, ...]
    transfer_samples: int
    eval_args: tuple[str, ...] = field(default=())
    generation_args: tuple[str, ...] = field(default=())  # bench's, for the local policy
    rl_settings: tuple[str, ...] = field(default=())  # KEY=VALUE for every RL run, after the ablation's own


PROFILES = {
    "gpu": Profile(
        device="cuda", shape_scale=1.0, n_train=400, n_validation=8, n_test=32, needs_base=True,
        sft_tasks=3000, sft_multi_turn_tasks=96,
        # more fused rows than the default 0.4/0.3/0.2/0.1: a policy trained on those seemed never to sample fused
        # answers
        sft_single_turn="partial=0.3,lazy=0.25,unfused=0.2,fused=0.25", sft_first_turn=None,
        # every weight trained: LoRA (rank 16, lr 2e-4) wrote 1 correct fused kernel in 13 tries, this 15 in 17
        # full determinism: the same digest on two GPUs in the same time, so adapters move between machines
        sft_args=("--epochs", "1", "--bf16", "--per-device-train-batch-size", "8", "--max-length", "4096",
                  "--learning-rate", "1e-4", "--lora-rank", "0", "--logging-steps", "10", "--full-determinism"),
        probe_tasks=32, probe_samples=2, rl_config="examples/mini/rl_gpu.yaml", bench_turns=3, bench_samples=4,
        max_tokens=1600,
        stts_turns=8, stts_context="topk:4", stts_samples=1,
        transfer_tasks=os.environ.get("DRKERNEL_KERNELBENCH", "kernelbench_levels1-3.jsonl"),  # or --transfer-tasks
        transfer_args=("--level", "1", "--problems", "19-32,36,38-40,47-49,53,88"), transfer_samples=1,
        eval_args=("--trials", "3", "--perf-trials", "10"),
        # compiled decoding, every batch filled to 32 rows (HFChatModel): a probe decoded at about 100 ms a
        # step without it, the trainer's compiled bf16 copy at 6.5 ms
        # every trajectory in flight in one batch (bench's 128, STTS's 32): a bench of 32 rows at a time generated
        # for 400 of its 502 s; a 135 M model's decoding step costs little more for 128 rows
        generation_args=("--static-cache", "--concurrency", "128"),
    ),
    "cpu": Profile(
        device="cpu", shape_scale=1 / 256, n_train=2, n_validation=1, n_test=2, needs_base=False, sft_tasks=8,
        sft_multi_turn_tasks=1, sft_single_turn=None, sft_first_turn=None,
        sft_args=("--vocab-size", "512", "--hidden-size", "32", "--intermediate-size", "64", "--num-layers", "2",
                  "--num-heads", "4", "--num-kv-heads", "2", "--max-steps", "2", "--use-cpu",
                  "--per-device-train-batch-size", "4", "--logging-steps", "1", "--lora-rank", "4"),
        probe_tasks=1, probe_samples=1, rl_config="examples/mini/rl_cpu.yaml", bench_turns=2, bench_samples=1,
        max_tokens=24,
        stts_turns=3, stts_context="topk:4", stts_samples=1,
        transfer_tasks=str(REPO / "examples" / "tasks"), transfer_args=("--problems", "2"), transfer_samples=1,
        eval_args=("--trials", "1", "--no-perf"),
    ),
}


# the study (docs/miniature.md, its protocol): the GPU reproduction with the runs' budget in one config, validation
# every 10 steps on 16 validation tasks, and model selection on it
PROFILES["study"] = dataclasses.replace(PROFILES["gpu"], n_validation=16, rl_config="examples/mini/rl_study.yaml")


def _finished(out: Path) -> bool:
    """Whether the bench run in `out` has every planned trajectory complete, by its summary."""
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return summary.get("planned_trajectories", 0) > 0 and summary.get("incomplete_trajectories") == 0


class Pipeline(ProcessPool):
    def __init__(self, root: Path, profile: Profile, gpus: int, time_limit_s: float | None, dry_run: bool,
                 per_gpu: int = 1, policies: tuple[str, ...] = DEFAULT_POLICIES, base: str | None = None,
                 whole_replicates: bool = False) -> None:
        self.root, self.p, self.gpus, self.dry_run, self.per_gpu = root, profile, gpus, dry_run, per_gpu
        self.whole_replicates = whole_replicates  # NAME-sN trains from sft-sN (the study), not from sft
        self.base_source = base  # --base
        self.policies = tuple(dict.fromkeys(policies))  # trained, benched, stts'd, transferred; in this order
        self.deadline = time.monotonic() + time_limit_s if time_limit_s else None
        self.incomplete: list[str] = []

    # --- the stages' command lines -----------------------------------------------------------------------------

    def splits(self) -> list[Step]:
        p, steps = self.p, []
        for split, n in (("train", p.n_train), ("validation", p.n_validation), ("test", p.n_test)):
            if not (self.root / split / "manifest.json").exists():
                steps.append(Step(f"synth {split}", CLI, [
                    "synth", "--split", split, "--n", str(n), "--seed", "0", "--shape-scale", repr(p.shape_scale),
                    "--variants", "", "--out", str(self.root / split)]))
        return steps

    def base(self) -> list[Step]:
        if (self.root / "base" / "config.json").exists():
            return []
        source = self.base_source or ("BASE.gguf" if self.dry_run and self.p.needs_base else None)
        if source is None:
            if self.p.needs_base:
                raise SystemExit("the gpu profile starts from a pretrained policy: --base GGUF (SmolLM2-135M-Instruct's, "
                                 "from `drkernel pretrained fetch`)")
            return []
        return [Step("base", CLI, ["pretrained", "convert", source, str(self.root / "base"), "--dtype", "float32"])]

    def mix(self) -> list[Step]:
        p, steps = self.p, []
        if not (self.root / "sft_data" / "sft.jsonl").exists():
            steps.append(Step("sft mix", "drkernel.train.synthetic_sft", [
                "--out", str(self.root / "sft_data"), "--n-tasks", str(p.sft_tasks),
                "--multi-turn-tasks", str(p.sft_multi_turn_tasks), "--seed", "0",
                "--shape-scale", repr(p.shape_scale), "--device", p.device,
                *(["--single-turn", p.sft_single_turn] if p.sft_single_turn else []),
                *(["--first-turn", p.sft_first_turn] if p.sft_first_turn else [])]))
        return steps

    def start_of(self, name: str) -> str:
        """The SFT policy an RL run trains from: sft-sN for replicate N with whole replicates, else sft."""
        return f"sft{REPLICATE}{ablation(name)[1]}" if self.whole_replicates and ablation(name)[1] else "sft"

    def sft_policies(self) -> tuple[str, ...]:
        """The SFT policies asked for (sft, sft-sN) and those the asked RL runs start from; sft when none."""
        asked = [name for name in self.policies if ablation(name)[0] == "sft"]
        starts = [self.start_of(name) for name in self.policies if ablation(name)[0] != "sft"]
        return tuple(dict.fromkeys(asked + starts)) or ("sft",)

    def sft(self) -> list[Step]:
        base = self.root / "base"
        with_base = self.p.needs_base or self.base_source is not None or (base / "config.json").exists()
        steps = []
        for name in self.sft_policies():
            if self.policy_path(name).exists():
                continue
            if with_base and not self.dry_run and not (base / "config.json").exists():
                raise SystemExit(f"sft: no pretrained policy at {base}; run the base stage first (--base GGUF)")
            start = ["--policy-path", str(base)] if with_base else []
            steps.append(Step(name, "drkernel.train.sft", [
                "--data", str(self.root / "sft_data" / "sft.jsonl"), "--out", str(self.root / name),
                "--seed", str(ablation(name)[1] or 0), *start, *self.p.sft_args]))
        return steps

    def policy_path(self, name: str) -> Path:
        """Where a policy's run leaves its final policy (what tells that the run is done)."""
        return self.root / (name if ablation(name)[0] == "sft" else f"rl/{name}") / "final"

    def chosen_policy(self, name: str) -> Path:
        """What the bench stages take: an RL run's policy chosen on validation (drkernel.train.selection)."""
        if ablation(name)[0] == "sft" or self.dry_run and not self.policy_path(name).exists():
            return self.policy_path(name)
        return select_policy(self.root / "rl" / name).policy

    def rl(self, name: str) -> list[Step]:
        run, seed = ablation(name)
        settings = dict(RL_RUNS).get(run)
        out = self.root / "rl" / name
        if settings is None or (out / "final").exists():
            return []
        args = ["train", "--config", str(REPO / self.p.rl_config),
                "--set", f"model={self.policy_path(self.start_of(name))}",
                "--set", f"tasks={self.root / 'train' / 'tasks'}",
                "--set", f"validation_tasks={self.root / 'validation' / 'tasks'}", "--set", f"output_dir={out}",
                # every judged turn with its task, advantage and code: what the update pushed towards, step by step
                "--log-samples", str(out / "samples.jsonl")]
        for setting in (*settings, *self.p.rl_settings, *([f"seed={seed}"] if seed is not None else [])):
            args += ["--set", setting]
        if any(out.glob("checkpoint-*")):
            args.append("--resume")
        return [Step(f"rl {name}", CLI, args)]

    def _bench(self, name: str, policy: str, tasks: str, out: Path, turns: int, context: str, samples: int,
               extra: tuple[str, ...] = ()) -> list[Step]:
        """The bench run as one step; none when its summary counts every planned trajectory complete (a rerun would
        only load the policy to ask nothing: 40 s a run on the H100)."""
        if _finished(out):
            return []
        if not self.dry_run and not self.policy_path(policy).exists():
            raise SystemExit(f"{name}: no policy at {self.policy_path(policy)}; finish the sft and rl stages first")
        args = ["bench", "--out", str(out)]
        if (out / "config.json").exists():
            args.append("--resume")  # asks only the turns still missing
        else:
            args += ["--tasks", tasks, *extra, "--model", f"hf:{self.chosen_policy(policy)}", "--device", self.p.device,
                     "--workers", "1", "--turns", str(turns), "--samples", str(samples),
                     "--context", context, "--max-tokens", str(self.p.max_tokens), "--temperature", "1.0",
                     "--top-p", "0.95", "--seed", "0", "--profiling-reward", *self.p.generation_args,
                     *self.p.eval_args]
        return [Step(name, CLI, args)]

    def probe(self, name: str) -> list[Step]:
        return self._bench(f"probe {name}", name, str(self.root / "train" / "tasks"), self.root / "probe" / name, 1,
                           "full", self.p.probe_samples, ("--problems", f"1-{self.p.probe_tasks}"))

    def bench(self, name: str) -> list[Step]:
        return self._bench(f"bench {name}", name, str(self.root / "test" / "tasks"), self.root / "bench" / name,
                           self.p.bench_turns, "full", self.p.bench_samples)

    def stts(self, name: str) -> list[Step]:
        return self._bench(f"stts {name}", name, str(self.root / "test" / "tasks"), self.root / "stts" / name,
                           self.p.stts_turns, self.p.stts_context, self.p.stts_samples)

    def transfer(self, name: str) -> list[Step]:
        return self._bench(f"transfer {name}", name, self.p.transfer_tasks, self.root / "transfer" / name,
                           self.p.bench_turns, "full", self.p.transfer_samples, self.p.transfer_args)

    def pack(self) -> list[Step]:
        """The RL runs' chosen policies (LoRA adapters) with their sizes and sha256: what to keep to bench again."""
        runs = [str(self.root / "rl" / name) for name in self.policies if ablation(name)[0] != "sft"
                and (self.dry_run or self.policy_path(name).exists())]
        return [Step("pack", "drkernel.train.pack", [*runs, "--out", str(self.root / "pack")])] if runs else []

    def report(self) -> list[Step]:
        steps = []
        order = {name: index for index, name in enumerate(POLICIES)}
        for stage in ("probe", "rl", "bench", "stts", "transfer"):
            # the SFT policy first: the report's differences table sets each run against the first
            runs = [str(path) for path in sorted((p for p in (self.root / stage).glob("*") if p.is_dir()),
                                                 key=lambda p: (order.get(p.name.partition(REPLICATE)[0],
                                                                          len(order)), p.name))]
            if runs or self.dry_run:
                paper = [] if stage == "transfer" else ["--no-paper"]  # the paper's numbers are KernelBench's
                steps.append(Step(f"report {stage}", CLI, ["report", *(runs or [f"{self.root}/{stage}/*"]),
                                                           "--out", str(self.root / "report" / stage), *paper]))
        return steps

    # --- running -------------------------------------------------------------------------------------------------

    def applies(self, stage: str, name: str) -> bool:
        """Whether a per-policy stage has a run for this policy: no RL run makes the SFT policy, STTS takes two."""
        return {"rl": ablation(name)[0] != "sft", "stts": ablation(name)[0] in STTS_POLICIES}.get(stage, True)

    def needs(self, stage: str, name: str) -> Path | None:
        """The RL policy the run needs on disk before it can start (the SFT policy must exist: _bench says so)."""
        return None if stage == "rl" or ablation(name)[0] == "sft" else self.policy_path(name)

    def run(self, stages: list[str]) -> None:
        """The stages in order. With GPUs, the per-policy stages asked for together are one pool of jobs, so a GPU
        whose run ended takes the next run whose policy exists (the SFT policy's bench while the RL runs train)
        instead of waiting for the stage's slowest run."""
        pooled = [stage for stage in stages if stage in PER_POLICY] if self.gpus >= 1 and not self.dry_run else []
        for stage in stages:
            if stage in pooled:
                if stage == pooled[0]:
                    for sft in self.sft_policies():
                        if not self.policy_path(sft).exists():
                            raise SystemExit(f"{stage}: no policy at {self.policy_path(sft)}; run the sft stage first")
                    self._run_pool([Job(stage, name, functools.partial(getattr(self, stage), name),
                                        self.needs(stage, name))
                                    for stage in pooled for name in self.policies if self.applies(stage, name)])
            else:
                self._run_stage(stage)
            if self.incomplete:
                return

    def _run_stage(self, stage: str) -> None:
        if stage not in PER_POLICY:
            steps = getattr(self, stage)()
        else:
            steps = []
            for name in self.policies:
                if not self.applies(stage, name):
                    continue
                if not self.dry_run and missing(self.needs(stage, name)):
                    print(f"[{stage}] {name}: not trained yet, left for a later call", flush=True)
                    continue
                steps += getattr(self, stage)(name)
        if not steps:
            print(f"[{stage}] done already", flush=True)
        for step in steps:
            print(f"[{stage}] {step.shown()}", flush=True)
        if self.dry_run:
            return
        if self.gpus == 0:
            for step in steps:
                self._run_in_process(step)
        elif steps:  # a stage's steps do not depend on each other (the SFT seeds train side by side)
            self._run_pool([Job(stage, "", functools.partial(list, [step])) for step in steps])

    def _run_in_process(self, step: Step) -> None:
        """The command in this process (no interpreter and import start-up per step: the CPU test runs them all)."""
        started = time.perf_counter()
        try:
            if step.module == CLI:
                from drkernel.cli.main import app

                code = app(args=step.args, prog_name="drkernel", standalone_mode=False)
            else:
                code = importlib.import_module(step.module).main(step.args)
        except SystemExit as exc:
            code = exc.code
        if code not in (None, 0):
            raise SystemExit(f"{step.name} failed with exit status {code}: {step.shown()}")
        print(f"[{step.name}] {time.perf_counter() - started:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("stages", nargs="+", choices=(*STAGES, "all"))
    parser.add_argument("--profile", choices=sorted(PROFILES), default="gpu")
    parser.add_argument("--root", type=Path, default=Path("runs/mini"))
    parser.add_argument("--base", default=None, help="the pretrained policy for the base stage: a GGUF (or a folder "
                        "holding one, or any model hf: takes); the gpu profile needs it")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs to spread a stage's runs over; 0: in this process")
    parser.add_argument("--per-gpu", type=int, default=1, help="runs sharing one GPU (small policies: their "
                        "evaluations still take the GPU alone to time, through the per-GPU gate)")
    parser.add_argument("--time-limit-s", type=float, default=None, help="stop the runs still going after this")
    parser.add_argument("--transfer-tasks", default=None, help="KernelBench tasks for `transfer` (the profile's "
                        "default on the GPU: $DRKERNEL_KERNELBENCH, KernelBench's levels 1-3 JSONL)")
    parser.add_argument("--shape-scale", type=float, default=None, help="task shapes (the profile's default: 1 on "
                        "the GPU); stage 0's calibration decides")
    parser.add_argument("--max-tokens", type=int, default=None, help="new tokens per answer in the stages run now "
                        "(the profile's default: 2048 on the GPU; a resumed bench keeps its own)")
    parser.add_argument("--single-turn", default=None, help="the mix's single-turn shares, e.g. "
                        "partial=0.3,lazy=0.25,unfused=0.2,fused=0.25 (the gpu profile's)")
    parser.add_argument("--first-turn", default=None, help="the first answers of the mix's two-turn rows, e.g. "
                        "lazy=0.25,partial=0.25,wrong=0.2,unfused=0.1,fused=0.2 (synthetic_sft's default: "
                        "lazy=0.35,partial=0.35,wrong=0.3); the second answer is always the fused one")
    parser.add_argument("--sft-args", default=None, help="more flags for the sft stage (drkernel.train.sft's; a "
                        "flag given again wins), e.g. '--lora-rank 16 --learning-rate 2e-4': a LoRA adapter")
    parser.add_argument("--bench-args", default=None, help="more flags for the new runs of the bench, probe, stts "
                        "and transfer stages (drkernel bench's; a flag given again wins), e.g. '--concurrency 32'")
    parser.add_argument("--rl-set", action="append", default=[], metavar="KEY=VALUE", help="a setting of "
                        "every RL run after its ablation's (drkernel train --set; repeat it), e.g. "
                        "learning_rate=1e-4")
    parser.add_argument("--policies", nargs="+", type=_policy, default=list(DEFAULT_POLICIES),
                        help="the policies `rl`, `bench`, `stts` and `transfer` take, in this order (the pool's, "
                        f"within a stage; default: {' '.join(DEFAULT_POLICIES)}; by name only: "
                        f"{' '.join(p for p in POLICIES if p not in DEFAULT_POLICIES)}; stts takes "
                        f"{', '.join(STTS_POLICIES)} of them), e.g. "
                        "one RL run and its bench; NAME-sN is a replicate of an RL run with "
                        "seed N (its own folder, `--set seed=N` last)")
    parser.add_argument("--whole-replicates", action="store_true", help="NAME-sN trains from sft-sN, the SFT of "
                        "seed N: each seed replicates the whole pipeline (the study's design, docs/miniature.md)")
    parser.add_argument("--dry-run", action="store_true", help="print the command lines, run nothing")
    args = parser.parse_args(argv)
    stages = STAGES if "all" in args.stages else [s for s in STAGES if s in args.stages]
    if args.max_tokens is not None and args.max_tokens < 1:
        parser.error("--max-tokens must be at least 1")
    given = {"transfer_tasks": args.transfer_tasks or None, "shape_scale": args.shape_scale or None,
             "max_tokens": args.max_tokens, "sft_single_turn": args.single_turn, "sft_first_turn": args.first_turn}
    profile = dataclasses.replace(PROFILES[args.profile], **{k: v for k, v in given.items() if v is not None})

    def more_flags(option: str, given: str | None) -> tuple[str, ...]:
        try:
            return tuple(shlex.split(given or ""))
        except ValueError as exc:  # an unclosed quote
            parser.error(f"{option}: {exc}")

    profile = dataclasses.replace(profile, sft_args=(*profile.sft_args, *more_flags("--sft-args", args.sft_args)),
                                  generation_args=(*profile.generation_args,
                                                   *more_flags("--bench-args", args.bench_args)))
    if args.rl_set:
        if any("=" not in setting for setting in args.rl_set):
            parser.error("--rl-set takes KEY=VALUE")
        profile = dataclasses.replace(profile, rl_settings=tuple(args.rl_set))
    if args.per_gpu < 1:
        parser.error("--per-gpu must be at least 1")
    pipeline = Pipeline(args.root.resolve(), profile, args.gpus, args.time_limit_s, args.dry_run, args.per_gpu,
                        tuple(args.policies), args.base, args.whole_replicates)
    pipeline.run(stages)
    if pipeline.incomplete:
        print(f"stopped at the time limit: {', '.join(pipeline.incomplete)}; run the same command again to "
              "continue", flush=True)
        return INCOMPLETE
    return 0


if __name__ == "__main__":
    sys.exit(main())
