"""The miniature reproduction (benchmarks/miniature.py, drkernel.train.sft): its command lines, its process runner,
and the whole pipeline shrunk for the CPU (data, SFT, the three RL runs, bench, STTS, transfer, report)."""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import pytest

from drkernel.train.sft import read_rows
from tests.scripts import load_script

REPO = Path(__file__).resolve().parent.parent


def _miniature():
    return load_script("benchmarks/miniature.py")


def test_sft_rows_are_prompt_and_final_answer(tmp_path):
    data = tmp_path / "sft.jsonl"
    turns = [{"role": "user", "content": "p"}, {"role": "assistant", "content": "wrong"},
             {"role": "user", "content": "feedback"}, {"role": "assistant", "content": "right"}]
    data.write_text(json.dumps({"messages": turns}) + "\n\n")
    assert read_rows(data) == [{"prompt": turns[:3], "completion": turns[3:]}]
    data.write_text(json.dumps({"messages": turns[:3]}) + "\n")
    with pytest.raises(ValueError, match=f"{data}:1: a row must start with a user message and end with an assistant"):
        read_rows(data)
    data.write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match=f"{data}:1: not a"):
        read_rows(data)


def test_gpu_commands_differ_only_in_the_ablation(tmp_path, capsys):
    miniature = _miniature()
    assert miniature.main(["rl", "transfer", "--root", str(tmp_path), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rl = [line for line in lines if line.startswith("[rl] drkernel train")]
    common = f"--set model={tmp_path}/sft/final --set tasks={tmp_path}/train/tasks"
    assert len(rl) == 3 and all(common in line and "examples/mini/rl_gpu.yaml" in line for line in rl)
    assert [line.split(f"output_dir={tmp_path}/rl/")[1] for line in rl] == [
        f"grpo --log-samples {tmp_path}/rl/grpo/samples.jsonl "
        "--set advantage_estimator=grpo --set profiling_reward=false --set prs=false",
        f"trloo --log-samples {tmp_path}/rl/trloo/samples.jsonl "
        "--set advantage_estimator=trloo --set profiling_reward=false --set prs=false",
        f"recipe --log-samples {tmp_path}/rl/recipe/samples.jsonl "
        "--set advantage_estimator=trloo --set profiling_reward=true --set prs=true",
    ]
    transfer = [line for line in lines if line.startswith("[transfer]")]
    assert len(transfer) == 4
    assert "--level 1 --problems 19-32,36,38-40,47-49,53,88 --model hf:" in transfer[0]
    assert not (tmp_path / "rl").exists()  # a dry run writes nothing
    with pytest.raises(SystemExit, match="the gpu profile starts from a pretrained policy: --base GGUF"):
        miniature.main(["base", "--root", str(tmp_path)])
    assert miniature.main(["bench", "transfer", "--root", str(tmp_path), "--dry-run", "--policies", "sft"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" --out ")[1].split()[0] for line in lines if line.startswith(("[bench]", "[transfer]"))] == [
        f"{tmp_path}/bench/sft", f"{tmp_path}/transfer/sft"]
    assert miniature.main(["bench", "--root", str(tmp_path), "--dry-run", "--policies", "sft",
                           "--bench-args", "--concurrency 32"]) == 0
    [bench] = capsys.readouterr().out.splitlines()
    assert "--static-cache --concurrency 128 --concurrency 32 --trials" in bench  # the last flag wins
    for option in ("--sft-args", "--bench-args"):
        with pytest.raises(SystemExit):
            miniature.main(["bench", "--root", str(tmp_path), "--dry-run", option, "'unclosed"])
        assert f"{option}: No closing quotation" in capsys.readouterr().err
    assert miniature.main(["mix", "probe", "--root", str(tmp_path), "--dry-run"]) == 0
    mix, probe, *rl_probes = capsys.readouterr().out.splitlines()
    assert "--single-turn partial=0.3,lazy=0.25,unfused=0.2,fused=0.25" in mix
    assert f"--tasks {tmp_path}/train/tasks --problems 1-32 --model hf:{tmp_path}/sft/final" in probe
    assert "--turns 1 --samples 2" in probe and f"--out {tmp_path}/probe/sft" in probe
    assert "--profiling-reward --static-cache --concurrency 128 --trials 3" in probe
    for name, line in zip(("grpo", "trloo", "recipe"), rl_probes, strict=True):  # the same prompts after RL
        assert line == probe.replace("sft/final", f"rl/{name}/final").replace("probe/sft", f"probe/{name}")
    assert miniature.main(["probe", "--root", str(tmp_path), "--policies", "recipe"]) == 0  # before its RL run
    assert capsys.readouterr().out.splitlines() == ["[probe] recipe: not trained yet, left for a later call",
                                                    "[probe] done already"]
    assert miniature.main(["mix", "sft", "--root", str(tmp_path), "--dry-run", "--single-turn", "fused=1",
                           "--sft-args", "--lora-rank 16 --learning-rate 2e-4"]) == 0
    mix, sft = capsys.readouterr().out.splitlines()
    assert mix.endswith("--single-turn fused=1") and "--first-turn" not in mix  # synthetic_sft's default
    assert miniature.main(["mix", "--root", str(tmp_path), "--dry-run", "--first-turn", "unfused=1,fused=1"]) == 0
    assert capsys.readouterr().out.strip().endswith(
        "--single-turn partial=0.3,lazy=0.25,unfused=0.2,fused=0.25 --first-turn unfused=1,fused=1")
    # the last flag wins
    assert sft.endswith("--lora-rank 0 --logging-steps 10 --full-determinism --lora-rank 16 --learning-rate 2e-4")
    run = tmp_path / "bench" / "sft"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    for incomplete, said in ((1, f"[bench] drkernel bench --out {run} --resume"), (0, "[bench] done already")):
        (run / "summary.json").write_text(json.dumps({"planned_trajectories": 128, "incomplete_trajectories": incomplete}))
        assert miniature.main(["bench", "--root", str(tmp_path), "--dry-run", "--policies", "sft"]) == 0
        assert capsys.readouterr().out.splitlines() == [said]
    assert miniature.main(["rl", "bench", "stts", "--root", str(tmp_path), "--dry-run", "--policies", "trloo"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["[rl]", "[bench]", "[stts]"]  # stts: sft and recipe only
    assert f"output_dir={tmp_path}/rl/trloo " in lines[0] and lines[2] == "[stts] done already"
    assert miniature.main(["rl", "--root", str(tmp_path), "--dry-run", "--policies", "recipe",
                           "--rl-set", "learning_rate=1e-4", "--rl-set", "max_steps=20"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(
        "--set prs=true --set learning_rate=1e-4 --set max_steps=20")  # after the ablation's: the last one wins
    with pytest.raises(SystemExit):
        miniature.main(["rl", "--root", str(tmp_path), "--dry-run", "--rl-set", "learning_rate"])


def _jobs(miniature, *steps):
    return [miniature.Job(step.name, "", functools.partial(list, [step])) for step in steps]


def test_time_limit_stops_the_processes_and_keeps_going_later(tmp_path):
    miniature = _miniature()
    pipeline = miniature.Pipeline(tmp_path, miniature.PROFILES["cpu"], gpus=2, time_limit_s=1.0, dry_run=False)
    quick = miniature.Step("quick", "json.tool", ["--help"])
    slow = miniature.Step("slow one", "timeit", ["-n", "1", "-r", "1", "import time; time.sleep(60)"])
    pipeline._run_pool(_jobs(miniature, quick, slow))
    assert pipeline.incomplete == ["slow one"]
    assert (tmp_path / "logs" / "slow_one.log").exists() and "usage" in (tmp_path / "logs" / "quick.log").read_text()
    failing = miniature.Step("failing", "json.tool", ["/nonexistent"])
    pipeline.deadline = None
    with pytest.raises(SystemExit, match=f"failed: failing; see {tmp_path / 'logs'}"):
        pipeline._run_pool(_jobs(miniature, failing))


def test_per_gpu_puts_several_runs_on_each_gpu(tmp_path, monkeypatch, capsys):
    miniature = _miniature()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7,9")  # the runs go to the GPUs this process was given
    monkeypatch.setattr(miniature.process_pool, "LOAD_EVERY_S", 0.2)
    pipeline = miniature.Pipeline(tmp_path, miniature.PROFILES["cpu"], gpus=2, time_limit_s=None, dry_run=False,
                                  per_gpu=2)
    show = "import os; print('gpu', os.environ['CUDA_VISIBLE_DEVICES'])"
    steps = [miniature.Step(f"run{i}", "timeit", ["-n", "1", "-r", "1", "-s", show, "import time; time.sleep(0.5)"])
             for i in range(5)]
    pipeline._run_pool(_jobs(miniature, *steps))
    seen = [(tmp_path / "logs" / f"run{i}.log").read_text().split("\n")[0] for i in range(5)]
    assert seen[:4] == ["gpu 5", "gpu 5", "gpu 7", "gpu 7"] and seen[4] in ("gpu 5", "gpu 7")  # 4 at once, then one
    load = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[pool]")]
    assert load and load[0].startswith("[pool] 4 running; host load ") and load[0].endswith(f"on {os.cpu_count()} CPUs")
    assert re.search(r"\(5 min\), \d+ of \d+ threads runnable on", load[0])  # Linux: /proc/loadavg
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(SystemExit, match="--gpus 2, but CUDA_VISIBLE_DEVICES=3 names 1"):
        pipeline._run_pool(_jobs(miniature, steps[0]))


def test_the_pool_gives_a_free_gpu_the_next_run_whose_policy_exists(tmp_path, capsys):
    """Two GPUs: the SFT policy's bench and an RL run start at once; the RL policy's bench waits for its run and
    takes the GPU the first run to end left; a bench whose policy nothing makes is left for later."""
    miniature = _miniature()
    pipeline = miniature.Pipeline(tmp_path, miniature.PROFILES["cpu"], gpus=2, time_limit_s=None, dry_run=False)
    policy = tmp_path / "rl" / "x" / "final"

    def step(name, seconds, then=""):
        code = f"import os, pathlib, time; time.sleep({seconds}); print('gpu', os.environ['CUDA_VISIBLE_DEVICES']); {then}"
        return miniature.Step(name, "timeit", ["-n", "1", "-r", "1", code])

    jobs = [miniature.Job("rl", "x", functools.partial(list, [step("rl x", 1.0, f"pathlib.Path('{policy}').mkdir(parents=True)")])),
            miniature.Job("bench", "sft", functools.partial(list, [step("bench sft", 0.2)])),
            miniature.Job("bench", "x", functools.partial(list, [step("bench x", 0.2)]), policy),
            miniature.Job("bench", "y", functools.partial(list, [step("bench y", 0.2)]), tmp_path / "rl" / "y" / "final"),
            miniature.Job("stts", "sft", functools.partial(list, []))]
    pipeline._run_pool(jobs)
    lines = capsys.readouterr().out.splitlines()
    said = [line.split(" timeit")[0].split(" exit")[0] for line in lines]
    assert said[:5] == ["[rl] python -m", "[bench] python -m", "[bench] y: not trained yet, left for a later call",
                        "[bench sft]", "[stts sft] done already"]
    assert sorted(said[5:]) == ["[bench x]", "[bench] python -m", "[rl x]"] and said[-1] == "[bench x]"
    assert lines[0].endswith("(GPU 0)") and lines[1].endswith("(GPU 1)")
    assert "rl/x" not in lines[1] and [line for line in lines[5:] if "(GPU 1)" in line]  # bench x: the freed GPU
    assert (tmp_path / "logs" / "bench_x.log").read_text().startswith("gpu 1")


def test_a_replicate_is_the_same_run_with_its_own_seed_and_folder(tmp_path, capsys):
    miniature = _miniature()
    assert miniature.main(["rl", "stts", "report", "--root", str(tmp_path), "--dry-run", "--policies", "sft", "recipe",
                           "recipe-s1", "grpo-s2", "grpostd-s1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rl = [line.split(f"output_dir={tmp_path}/rl/")[1].split(" --set ", 1) for line in lines if line.startswith("[rl]")]
    assert rl == [[f"recipe --log-samples {tmp_path}/rl/recipe/samples.jsonl",
                   "advantage_estimator=trloo --set profiling_reward=true --set prs=true"],
                  [f"recipe-s1 --log-samples {tmp_path}/rl/recipe-s1/samples.jsonl",
                   "advantage_estimator=trloo --set profiling_reward=true --set prs=true --set seed=1"],
                  [f"grpo-s2 --log-samples {tmp_path}/rl/grpo-s2/samples.jsonl",
                   "advantage_estimator=grpo --set profiling_reward=false --set prs=false --set seed=2"],
                  [f"grpostd-s1 --log-samples {tmp_path}/rl/grpostd-s1/samples.jsonl",  # by name only
                   "advantage_estimator=grpo_std --set profiling_reward=false --set prs=false --set seed=1"]]
    stts = [line.split(" --out ")[1].split()[0] for line in lines if line.startswith("[stts]")]
    # (d)'s replicate too
    assert stts == [f"{tmp_path}/stts/sft", f"{tmp_path}/stts/recipe", f"{tmp_path}/stts/recipe-s1"]
    for bad in ("sft-s", "recipe-s", "recipe-sx", "dpo"):
        with pytest.raises(SystemExit):
            miniature.main(["rl", "--root", str(tmp_path), "--dry-run", "--policies", bad])
        assert f"argument --policies: '{bad}' is not a policy" in capsys.readouterr().err
    for name in ("recipe-s1", "grpo-s2", "sft"):  # the report puts each replicate beside its run, (a) first
        (tmp_path / "bench" / name).mkdir(parents=True)
    (tmp_path / "bench" / "recipe").mkdir()
    miniature.main(["report", "--root", str(tmp_path), "--dry-run"])
    (bench,) = [line for line in capsys.readouterr().out.splitlines() if f"--out {tmp_path}/report/bench" in line]
    assert bench.split(" --out ")[0].split("drkernel report ")[1].split() == [
        str(tmp_path / "bench" / name) for name in ("sft", "grpo-s2", "recipe", "recipe-s1")]


def test_the_study_s_replicates_are_whole_and_its_benches_take_the_policy_chosen_on_validation(tmp_path, capsys,
                                                                                                  monkeypatch):
    miniature = _miniature()
    study = ["--profile", "study", "--root", str(tmp_path), "--whole-replicates", "--policies", "sft-s1", "sft-s2",
             "grpo-s1", "recipemrs-s2"]
    assert miniature.main(["sft", "rl", "bench", "pack", "--dry-run", *study]) == 0
    lines = capsys.readouterr().out.splitlines()
    sft = [line for line in lines if line.startswith("[sft]")]
    assert [line.split(" --out ")[1].split()[:3] for line in sft] == [
        [f"{tmp_path}/sft-s1", "--seed", "1"], [f"{tmp_path}/sft-s2", "--seed", "2"]]
    rl = [line for line in lines if line.startswith("[rl]")]
    assert all("examples/mini/rl_study.yaml" in line for line in rl)
    assert f"--set model={tmp_path}/sft-s1/final " in rl[0] and rl[0].endswith("--set prs=false --set seed=1")
    assert f"--set model={tmp_path}/sft-s2/final " in rl[1] and rl[1].endswith("--set mrs=true --set seed=2")
    assert [line for line in lines if line.startswith("[pack]")] == [
        f"[pack] python -m drkernel.train.pack {tmp_path}/rl/grpo-s1 {tmp_path}/rl/recipemrs-s2 --out {tmp_path}/pack"]
    # the bench takes the policy of the best validation (the later step on a tie), not the last step's
    run = tmp_path / "rl" / "grpo-s1"
    (run / "final").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": step, "validation": {"fast_1_2": score}}) + "\n"
                                               for step, score in ((10, 0.25), (20, 0.5), (30, 0.5 - 1e-9))))
    for step in (10, 20, 30):
        (run / "validation" / f"step_{step}" / "policy").mkdir(parents=True)
    assert miniature.main(["bench", "--dry-run", *study]) == 0
    bench = [line for line in capsys.readouterr().out.splitlines() if f"--out {tmp_path}/bench/grpo-s1" in line]
    assert len(bench) == 1 and f"--model hf:{run}/validation/step_20/policy " in bench[0]
    # with GPUs the SFT seeds train side by side; the RL runs wait for the SFT policy of their seed
    pipeline = miniature.Pipeline(tmp_path, miniature.PROFILES["study"], gpus=4, time_limit_s=None, dry_run=False,
                                  policies=("grpo-s1", "recipemrs-s2"), base="base.gguf", whole_replicates=True)
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    pooled = []
    monkeypatch.setattr(pipeline, "_run_pool", pooled.append)
    pipeline.run(["sft"])
    assert [[job.make()[0].name for job in jobs] for jobs in pooled] == [["sft-s1", "sft-s2"]]
    with pytest.raises(SystemExit, match=f"rl: no policy at {tmp_path}/sft-s1/final; run the sft stage first"):
        pipeline.run(["rl"])


def test_gpus_pool_the_per_policy_stages_in_stage_then_policy_order(tmp_path, monkeypatch):
    miniature = _miniature()
    (tmp_path / "sft" / "final").mkdir(parents=True)
    pipeline = miniature.Pipeline(tmp_path, miniature.PROFILES["gpu"], gpus=4, time_limit_s=None, dry_run=False,
                                  policies=("sft", "recipe", "grpo"))
    pooled = []
    monkeypatch.setattr(pipeline, "_run_pool", pooled.append)
    pipeline.run(["rl", "bench", "stts", "report"])
    (jobs,) = pooled
    assert [(job.name, job.needs) for job in jobs] == [
        ("rl recipe", None), ("rl grpo", None), ("bench sft", None),
        ("bench recipe", tmp_path / "rl" / "recipe" / "final"), ("bench grpo", tmp_path / "rl" / "grpo" / "final"),
        ("stts sft", None), ("stts recipe", tmp_path / "rl" / "recipe" / "final")]
    (tmp_path / "rl" / "recipe" / "final").mkdir(parents=True)  # as its RL run leaves it
    (step,) = jobs[3].make()  # the command line is made when a GPU takes the job
    assert step.name == "bench recipe" and f"hf:{tmp_path}/rl/recipe/final" in step.args
    (tmp_path / "sft" / "final").rmdir()
    with pytest.raises(SystemExit, match=f"rl: no policy at {tmp_path}/sft/final; run the sft stage first"):
        pipeline.run(["rl", "bench"])


@pytest.mark.slow
def test_sft_without_a_base_builds_a_policy_from_scratch(tmp_path):
    """The cpu profile's other start: a tokenizer trained on the rows and a random policy, then a bf16 checkpoint."""
    import torch

    from drkernel.train.policy import PolicyShape
    from drkernel.train.sft import SFTRunConfig, run_sft, weights_digest

    turns = [{"role": "user", "content": "write ModelNew"}, {"role": "assistant", "content": "class ModelNew: pass"}]
    (tmp_path / "sft.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    summary = run_sft(SFTRunConfig(str(tmp_path / "sft.jsonl"), str(tmp_path / "out"), PolicyShape(vocab_size=300),
                                   max_steps=1, use_cpu=True, per_device_train_batch_size=1, logging_steps=1))
    assert (summary["rows"], summary["steps"]) == (1, 1)
    assert summary["trained_parameters"] == summary["parameters"]  # all of them, without LoRA
    assert (tmp_path / "out" / "policy" / "tokenizer.json").exists()
    assert json.loads((tmp_path / "out" / "final" / "config.json").read_text())["dtype"] == "bfloat16"
    # the digest covers every weight file's bytes: the same rows, seed and machine give the same policy again, also
    # under full determinism (which the Trainer switches on for its process: put back here for the other tests)
    environ = dict(os.environ)
    try:
        again = run_sft(SFTRunConfig(str(tmp_path / "sft.jsonl"), str(tmp_path / "again"), PolicyShape(vocab_size=300),
                                     max_steps=1, use_cpu=True, per_device_train_batch_size=1, logging_steps=1,
                                     full_determinism=True))
        assert torch.are_deterministic_algorithms_enabled() and os.environ["CUBLAS_WORKSPACE_CONFIG"]
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
        os.environ.clear()
        os.environ.update(environ)
    assert again["config"]["full_determinism"] and not summary["config"]["full_determinism"]
    assert again["weights_sha256"] == summary["weights_sha256"] == weights_digest(tmp_path / "out" / "final")
    weights = next((tmp_path / "again" / "final").glob("*.safetensors"))
    data = weights.read_bytes()
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # one byte changed
    assert weights_digest(tmp_path / "again" / "final") != summary["weights_sha256"]


@pytest.mark.slow
def test_tiny_pipeline_on_the_cpu(tmp_path, capsys):
    """The stages the GPU runs, from a tiny GGUF written here as the pretrained base: every policy after it is a
    LoRA adapter over the one before."""
    from tests.test_local_models import tiny_llama, write_gguf

    miniature = _miniature()
    root = tmp_path / "mini"
    gguf = write_gguf(tiny_llama(tmp_path / "source"), tmp_path / "base.gguf")
    assert miniature.main(["all", "--profile", "cpu", "--root", str(root), "--base", str(gguf)]) == 0

    # data: the splits, the SFT mix with one two-turn row judged by the agent loop
    mix = json.loads((root / "sft_data" / "mix.json").read_text())
    assert (mix["single_turn"], mix["first_turn"], mix["multi_turn_kept"], mix["rows"]) == (
        {"partial": 3, "lazy": 2, "unfused": 2, "fused": 1}, {"lazy": 1}, 1, 9)

    # the base: the GGUF dequantised; SFT: two steps of a LoRA adapter over it, loss on the final answers only
    assert json.loads((root / "base" / "config.json").read_text())["model_type"] == "llama"
    summary = json.loads((root / "sft" / "sft_summary.json").read_text())
    assert (summary["rows"], summary["steps"], len(summary["loss"])) == (9, 2, 2)
    assert summary["train_loss"] == pytest.approx(sum(entry["loss"] for entry in summary["loss"]) / 2)
    assert 0 < summary["trained_parameters"] < summary["parameters"] / 2
    assert summary["largest_file_bytes"] <= 15_000_000
    adapter = json.loads((root / "sft" / "final" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["base_model_name_or_path"]) == (4, str(root / "base"))
    from drkernel.train.sft import SFTRunConfig, sft_trainer

    rows = read_rows(root / "sft_data" / "sft.jsonl")
    trainer = sft_trainer(SFTRunConfig(str(root / "sft_data" / "sft.jsonl"), str(tmp_path / "again"), max_steps=1,
                                       use_cpu=True), rows, root / "base")
    tokenizer = trainer.processing_class
    for row, tokenized in zip(rows, trainer.train_dataset):
        answer = [t for t, label in zip(tokenized["input_ids"], tokenized["labels"]) if label != -100]
        assert tokenizer.decode(answer) == row["completion"][0]["content"] + "<|im_end|>\n"
    assert max(len(row["prompt"]) for row in rows) == 3  # the two-turn row: its wrong first answer is context

    # RL: one step of each ablation, with the contract's metrics, from the SFT policy
    for name, estimator, prs in (("grpo", "grpo", False), ("trloo", "trloo", False), ("recipe", "trloo", True)):
        config = json.loads((root / "rl" / name / "train_config.json").read_text())
        assert (config["advantage_estimator"], config["prs"], config["profiling_reward"]) == (estimator, prs, prs)
        assert config["model"] == str(root / "sft" / "final") and config["lora_rank"] == 4
        adapter = json.loads((root / "rl" / name / "final" / "adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == str(root / "sft" / "final")
        (metrics,) = [json.loads(line) for line in (root / "rl" / name / "metrics.jsonl").read_text().splitlines()]
        assert metrics["step"] == 1 and len(metrics["turn_correct"]) == 2
        assert len(metrics["validation"]["turn_fast_1_2"]) == 2
        assert (root / "rl" / name / "validation" / "step_1" / "summary.json").exists()
        # the step's judged turns, one line each (1 prompt x 1 sample x up to 2 turns), with the code they judged
        samples = [json.loads(line) for line in (root / "rl" / name / "samples.jsonl").read_text().splitlines()]
        assert len(samples) == metrics["evaluations"] + sum(r["status"] == "format_error" for r in samples) > 0
        assert all(r["step"] == 1 and "code" in r for r in samples)
        # one prompt a step
        assert metrics["tasks"] == sorted({r["task"] for r in samples}) and len(metrics["tasks"]) == 1

    # bench on the test split for the four policies, STTS of (a) and (d), transfer, then the reports
    for stage, names, turns in (("bench", miniature.DEFAULT_POLICIES, 2), ("stts", ("sft", "recipe"), 3),
                                ("transfer", miniature.DEFAULT_POLICIES, 2)):
        for name in names:
            bench = json.loads((root / stage / name / "config.json").read_text())
            assert bench["turns"] == turns and bench["context"] == ("topk:4" if stage == "stts" else "full")
            records = [json.loads(line) for line in (root / stage / name / "trajectories.jsonl").read_text().splitlines()]
            tasks = {"2_relu"} if stage == "transfer" else {path.stem for path in (root / "test" / "tasks").glob("*.py")}
            assert sorted((r["task"], r["turn"]) for r in records) == sorted((t, k + 1) for t in tasks for k in range(turns))
    for name in miniature.DEFAULT_POLICIES:  # each policy's first answer to the same train prompt, after the RL runs
        probe = [json.loads(line) for line in (root / "probe" / name / "trajectories.jsonl").read_text().splitlines()]
        assert [(r["task"], r["turn"]) for r in probe] == [(next((root / "train" / "tasks").glob("1_*.py")).stem, 1)]
    for stage in ("probe", "rl", "bench", "stts", "transfer"):
        assert (root / "report" / stage / "report.html").stat().st_size > 0
    # each bench stage's policies against the SFT policy (a), on the tasks they share
    differences = (root / "report" / "bench" / "tables" / "differences.csv").read_text().splitlines()
    assert [line.split(",")[:2] for line in differences[1::6]] == [["grpo", "sft"], ["trloo", "sft"], ["recipe", "sft"]]

    # a second call finds everything done; a run without its final model resumes from its checkpoint
    capsys.readouterr()
    assert miniature.main(["base", "sft", "probe", "rl", "bench", "--profile", "cpu", "--root", str(root)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"[{stage}] done already" for stage in
                                                    ("base", "sft", "rl", "probe", "bench")]
    (root / "rl" / "grpo" / "final").rename(root / "rl" / "grpo" / "final.old")
    assert miniature.main(["rl", "--profile", "cpu", "--root", str(root), "--dry-run"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("--set prs=false --resume")


def test_rl_configs_load_and_keep_small_updates():
    from drkernel.train.config import ConfigError, load_config

    gpu = load_config(REPO / "examples" / "mini" / "rl_gpu.yaml", ["model=m", "validation_tasks=v", "bf16=false"])
    assert (gpu.model_dtype, gpu.turns, gpu.max_new_tokens, gpu.save_steps, gpu.lora_rank) == ("float32", 3, 1600, 1, 8)
    assert gpu.grpo_config().generation_batch_size == 16  # 2 prompts x 8 samples, whole groups for TRL
    assert (gpu.rollout_dtype, gpu.mrs_on, gpu.max_steps, gpu.learning_rate) == ("bfloat16", False, 10, 5e-4)
    study = load_config(REPO / "examples" / "mini" / "rl_study.yaml", ["model=m", "validation_tasks=v", "bf16=false"])
    assert study.grpo_config().generation_batch_size == 16 and study.num_generations == 4  # 4 prompts x 4 samples
    assert (study.max_steps, study.validation_every, study.validation_samples, study.mrs_on) == (30, 10, 2, False)
    differ = {key for key, value in vars(study).items() if vars(gpu).get(key) != value}
    assert differ == {"num_generations", "max_steps", "validation_every", "validation_samples"}
    cpu = load_config(REPO / "examples" / "mini" / "rl_cpu.yaml", ["model=m", "validation_tasks=v"])
    assert cpu.grpo_config().generation_batch_size == 2
    with pytest.raises(ConfigError, match="model_dtype must be auto, float32 or bfloat16, not 'float16'"):
        load_config(REPO / "examples" / "mini" / "rl_cpu.yaml", ["model_dtype=float16"])
