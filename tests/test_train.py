"""drkernel.train: config, step signals, the multi-turn rollout and two real training steps on the CPU.

The training test scripts the model's answers (a random model never writes code) but every reward comes from a
real evaluation of real code by the embedded scheduler under Triton's interpreter.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from drkernel.rl import grpo_advantages, prs_keep_mask, reward_to_go, rloo_advantages, trloo_advantages
from drkernel.train.config import ConfigError, load_config
from drkernel.train.signals import JudgedTurn, group_of, step_signals, void_turns

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "examples" / "train" / "tiny_cpu.yaml"
CANDIDATES = REPO / "examples" / "candidates"


# --- config -------------------------------------------------------------------------------------------------


def test_unknown_key_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) bogus; known keys: model, tasks, "):
        load_config(TINY, ["bogus=1"])


def test_overrides_are_typed_and_checked():
    config = load_config(TINY, ["turns=2", "learning_rate=1e-6", "mrs=true", "report_to=tensorboard"])
    assert (config.turns, config.learning_rate, config.mrs, config.report_to) == (2, 1e-6, True, ["tensorboard"])
    config = load_config(TINY, ["validation_tasks=hub:", "mrs=null", "report_to=[tensorboard, wandb]"])
    assert (config.validation_tasks, config.mrs, config.mrs_on, config.report_to) == ("hub:", None, False, ["tensorboard", "wandb"])
    with pytest.raises(ConfigError, match="turns: 'x' is not a <class 'int'>"):
        load_config(TINY, ["turns=x"])
    with pytest.raises(ConfigError, match="advantage_estimator must be one of trloo, grpo, grpo_std, rloo, not 'ppo'"):
        load_config(TINY, ["advantage_estimator=ppo"])
    with pytest.raises(ConfigError, match="rollout_dtype must be float32, bfloat16 or float16 .or unset., not 'fp8'"):
        load_config(TINY, ["rollout_dtype=fp8"])
    with pytest.raises(ConfigError, match="use_vllm samples with vLLM: choose one"):
        load_config(TINY, ["rollout_dtype=bfloat16", "use_vllm=true"])
    assert not load_config(TINY, ["rollout_dtype=bfloat16", "mrs=false"]).mrs_on  # MRS stays the user's to choose


def test_context_that_hides_trained_turns_is_refused():
    with pytest.raises(ConfigError, match="context 'window:1' hides earlier turns within the 3 trained turns"):
        load_config(TINY, ["context=window:1"])
    assert load_config(TINY, ["context=last:2"]).context == "last:2"  # shows both earlier turns of 3


# --- step signals ---------------------------------------------------------------------------------------------


def test_groups_follow_trl_order_across_processes():
    # 2 processes x 4 rows, num_generations 4: process 1's rows continue the global order.
    assert [group_of(p * 4 + i, 4) for p in range(2) for i in range(4)] == [
        (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    # a group split over processes (num_generations 4, 2 rows per process) still gathers into one group
    assert {group_of(t, 4)[0] for t in (2, 3)} == {group_of(t, 4)[0] for t in (0, 1)}


def _turns(rewards_by_trajectory):
    return [
        JudgedTurn(trajectory=t, turn=k + 1, reward=r, correct=r > 0, coverage=cov)
        for t, rewards in enumerate(rewards_by_trajectory)
        for k, (r, cov) in enumerate(rewards)
    ]


def test_advantages_are_drkernel_rl_on_reward_to_go():
    turns = _turns([[(0.0, None), (1.0, 0.5)], [(0.5, 0.9), (0.0, None)], [(1.0, 0.2), (1.5, 0.8)], [(0.0, None), (0.0, None)]])
    returns = reward_to_go(torch.tensor([[0.0, 1.0], [0.5, 0.0], [1.0, 1.5], [0.0, 0.0]], dtype=torch.float64)).flatten()
    prompts = [0, 0, 0, 0, 1, 1, 1, 1]  # num_generations 2: trajectories 0, 1 are prompt 0
    turn_ids = [1, 2] * 4
    expected = {
        "trloo": trloo_advantages(returns, prompts, turn_ids),
        "grpo": grpo_advantages(returns, prompts, turn_ids),
        "grpo_std": grpo_advantages(returns, prompts, turn_ids, normalize_std=True),
        "rloo": rloo_advantages(returns, prompts),
    }
    for estimator, want in expected.items():
        got = step_signals(turns, 2, estimator=estimator, void_turn=False)
        assert [s.ret for s in got] == returns.tolist()
        assert [s.advantage for s in got] == pytest.approx(want.tolist(), abs=1e-12), estimator
    assert [s.advantage for s in step_signals(turns, 2)][:4] == [0.5, 1.0, -0.5, -1.0]
    # a group of two: GRPO's advantages are TRLOO's halved, and with the std they are +-1/sqrt(2) (or 0: a tie)
    grpo, std = ([s.advantage for s in step_signals(turns, 2, estimator=e, void_turn=False)] for e in ("grpo", "grpo_std"))
    assert grpo[:4] == [0.25, 0.5, -0.25, -0.5]
    assert std[:4] == pytest.approx([2 ** -0.5, 2 ** -0.5, -(2 ** -0.5), -(2 ** -0.5)], abs=1e-5)  # eps 1e-6


def test_void_turn_drops_exactly_the_regressions_after_a_success():
    turns = _turns([[(0.5, None), (0.0, None), (0.0, None), (1.0, None)], [(0.0, None), (0.0, None), (0.5, None), (0.0, None)]])
    assert void_turns(turns) == [False, True, True, False, False, False, False, True]
    signals = step_signals(turns, 2)
    assert [s.why_not for s in signals] == [None, "void_turn", "void_turn", None, None, None, None, "void_turn"]
    assert all(s.kept for s in step_signals(turns, 2, void_turn=False))


def test_prs_drops_what_its_seeded_draw_says():
    turns = _turns([[(1.0, 0.35), (1.0, 0.31), (0.0, None)], [(1.0, 0.5), (1.0, 0.1), (1.0, None)]])
    want = prs_keep_mask([0.35, 0.31, float("nan"), 0.5, 0.1, float("nan")], [True, True, False, True, True, True], 7)
    got = step_signals(turns, 2, prs=True, prs_seed=7, void_turn=False)
    assert [s.kept for s in got] == want.tolist()
    assert [s.why_not for s in got][2:] == [None, None, "prs", "prs"]  # p = 0.0 below 0.3 and unmeasured: dropped


def test_mrs_per_turn_rejects_a_mismatched_turn_only():
    from drkernel.train.signals import mrs_turn_keep

    trainer = torch.full((1, 6), -1.0)
    rollout = trainer.clone()
    rollout[0, 4] = -1.01  # a 1% mismatch on one token of the second turn
    masks = torch.tensor([[1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 0]], dtype=torch.bool)
    assert mrs_turn_keep(trainer, rollout, [0, 0], masks) == [True, False]
    rollout[0, 0] = trainer[0, 0] + 10.0  # the trainer finds this token e^-10 as likely: vetoed
    assert mrs_turn_keep(trainer, rollout, [0, 0], masks) == [False, False]


def test_the_static_cache_is_sized_at_the_first_turn_for_the_whole_trajectory():
    """One length for every turn of a run (transformers compiles the decoding step once per length): the first
    turn's context, each turn's answer and the feedback between; a context that outgrows it sizes it again."""
    from types import SimpleNamespace

    from drkernel.train.config import TrainConfig
    from drkernel.train.trainer import FEEDBACK_TOKENS, DrKernelTrainer

    trainer = SimpleNamespace(config=TrainConfig(turns=3, max_new_tokens=100), _cache_len=0)
    first = DrKernelTrainer._static_cache_len(trainer, 50)
    assert first == 50 + 3 * 100 + 2 * FEEDBACK_TOKENS
    assert DrKernelTrainer._static_cache_len(trainer, 50 + 2 * (100 + FEEDBACK_TOKENS)) == first  # the third turn
    assert DrKernelTrainer._static_cache_len(trainer, first) == first + 3 * 100 + 2 * FEEDBACK_TOKENS


def test_the_rollout_copy_holds_the_policy_s_merged_weights_of_each_step_and_samples_as_it_does(tmp_path,
                                                                                                  tiny_policy):
    """rollout_dtype: sampling from a plain copy (what transformers compiles whole on a GPU), synced once per step
    with the LoRA policy's merged weights; a float32 copy samples the tokens the policy itself samples."""
    from drkernel.train import run as run_module
    from drkernel.train.lora import merged_weights

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    shutil.copy(REPO / "examples" / "tasks" / "2_relu.py", tasks)
    settings = [f"tasks={tasks}", f"output_dir={tmp_path / 'run'}", f"model={tiny_policy}", "turns=1",
                "num_generations=2", "per_device_train_batch_size=2", "max_steps=1", "max_new_tokens=8",
                "lora_rank=4", "rollout_dtype=float32", "validation_every=0"]
    trainer = run_module.train(load_config(TINY, settings))
    assert trainer.config.mrs_on  # another engine than the trainer's forward pass: MRS on by default
    policy = trainer.accelerator.unwrap_model(trainer.model)
    copy = trainer._rollout_copy()
    before = {name: tensor.clone() for name, tensor in copy.state_dict().items()}
    with torch.no_grad():  # what an optimizer step does to the adapter
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1)
    assert trainer._rollout_copy() is copy and all(torch.equal(before[k], v) for k, v in copy.state_dict().items())
    trainer.state.global_step += 1  # the next step: synced, in place
    assert trainer._rollout_copy() is copy
    merged = merged_weights(policy)
    assert set(merged) == set(copy.state_dict())
    assert all(torch.equal(copy.state_dict()[name], tensor) for name, tensor in merged.items())
    assert not all(torch.equal(before[name], tensor) for name, tensor in merged.items())
    contexts = [trainer.processing_class("write a relu kernel")["input_ids"]] * 2
    torch.manual_seed(0)
    from_copy, logprobs = trainer.sample_transformers(contexts)
    trainer.config.rollout_dtype = None
    torch.manual_seed(0)
    assert trainer.sample_transformers(contexts)[0] == from_copy
    assert logprobs is not None and len(logprobs[0]) == len(from_copy[0])


# --- the rollout ----------------------------------------------------------------------------------------------


class _ScriptedEvaluator:
    """Fails `failures` times, then gives `status` to every code (for the rollout's own logic, not KernelGym's)."""

    def __init__(self, failures: int, status: str = "correct", cached: bool = False) -> None:
        self.failures, self.status, self.cached = failures, status, cached

    async def evaluate(self, task, code):
        from drkernel.schema import EvalResult

        if self.failures:
            self.failures -= 1
            raise ConnectionError("evaluator down")
        return EvalResult(status=self.status, correct=self.status == "correct", cached=self.cached)


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    from drkernel.train.policy import PolicyShape, build_policy

    texts = [p.read_text() for p in sorted(CANDIDATES.glob("*.py"))]
    return build_policy(tmp_path_factory.mktemp("policy"), texts, PolicyShape(hidden_size=32, intermediate_size=64))


def _rollout(tiny_policy, evaluator, answers, turns=2):
    from transformers import AutoTokenizer

    from drkernel.rl import RewardConfig
    from drkernel.tasks.loaders import load_task_file
    from drkernel.train.rollout import MultiTurnRollout

    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    script = iter(answers)

    def generate(contexts):
        return [tokenizer(next(script), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for _ in contexts], None

    rollout = MultiTurnRollout(tokenizer, evaluator, generate, turns, RewardConfig(), evaluator_retries=1, evaluator_backoff_s=0)
    traj = rollout.start(load_task_file(REPO / "examples" / "tasks" / "2_relu.py"), "Write ReLU.")
    return tokenizer, rollout, traj


def test_turns_form_one_sequence_with_feedback_masked(tiny_policy):
    code = (CANDIDATES / "2_relu__triton.py").read_text()
    tokenizer, rollout, traj = _rollout(tiny_policy, _ScriptedEvaluator(0), ["no code <|im_start|> here", f"```python\n{code}```"])
    rollout.run([traj], [0])
    (s1, e1), (s2, e2) = traj.spans
    assert traj.env_mask == [1] * e1 + [0] * (s2 - e1) + [1] * (e2 - s2)
    assert [r.reward for r in traj.records] == [0.0, 0.5]  # the base reward: no speedup measured
    assert [r.status for r in traj.records] == ["format_error", "correct"]
    # the sequence is exactly what the chat template renders for the next turn's prompt plus the answer
    full = tokenizer.decode(traj.prompt_ids + traj.completion_ids[:s2])
    assert full == tokenizer.apply_chat_template(traj.records[1].messages, tokenize=False, add_generation_prompt=True)
    assert traj.records[1].messages[1]["content"] == "no code <|im_start|> here"


def test_evaluator_down_retries_then_fails_the_step(tiny_policy):
    from drkernel.train.rollout import EvaluatorUnavailable

    code = (CANDIDATES / "2_relu__triton.py").read_text()
    answer = f"```python\n{code}```"
    _, rollout, traj = _rollout(tiny_policy, _ScriptedEvaluator(1), [answer, answer])
    rollout.run([traj], [0])  # one failure, one retry: judged
    assert traj.records[0].status == "correct"
    _, rollout, traj = _rollout(tiny_policy, _ScriptedEvaluator(2), [answer])
    with pytest.raises(EvaluatorUnavailable, match="the evaluator failed 2 times in a row for task 2_relu: ConnectionError"):
        rollout.run([traj], [0])


def test_crashed_evaluation_is_reward_zero_and_counted(tiny_policy):
    code = (CANDIDATES / "2_relu__triton.py").read_text()
    _, rollout, traj = _rollout(tiny_policy, _ScriptedEvaluator(0, "crashed"), [f"```python\n{code}```"] * 2)
    rollout.run([traj], [0])
    assert [(r.status, r.reward) for r in traj.records] == [("crashed", 0.0), ("crashed", 0.0)]
    assert (rollout.stats.evaluations, rollout.stats.crashed) == (2, 2)


def test_cached_evaluations_are_counted_and_recorded(tiny_policy):
    code = (CANDIDATES / "2_relu__triton.py").read_text()
    _, rollout, traj = _rollout(tiny_policy, _ScriptedEvaluator(0, cached=True), [f"```python\n{code}```"] * 2)
    rollout.run([traj], [0])
    assert [r.cached for r in traj.records] == [True, True]
    assert (rollout.stats.evaluations, rollout.stats.cached) == (2, 2)


def test_the_evaluation_settings_nest_and_older_flat_keys_still_read():
    """TrainConfig holds EvalOptions and EngineConfig (it copied their fields); the older flat keys (evaluator,
    eval_device, eval_cache_entries, ...) still read, into the nested settings."""
    from drkernel.train.run import validation_bench_config

    config = load_config(TINY, ["engine.result_cache=0", "evaluation.device=cpu", "engine.name=ray:auto"])
    assert (config.engine.result_cache, config.evaluation.device, config.engine.kind) == (0, "cpu", "ray")
    older = load_config(TINY, ["eval_cache_entries=0", "eval_device=cpu", "evaluator=ray:auto"])
    assert (older.engine, older.evaluation) == (config.engine, config.evaluation)
    assert load_config(TINY, []).engine.result_cache == 4096
    bench = validation_bench_config(config, "m")
    assert bench.engine is config.engine and bench.evaluation is config.evaluation  # nested, not copied
    with pytest.raises(ConfigError, match="engine: result_cache must be >= 0"):
        load_config(TINY, ["engine.result_cache=-1"])
    with pytest.raises(ConfigError, match="unknown config key.s. evaluation.bogus; known keys: evaluation.device"):
        load_config(TINY, ["evaluation.bogus=1"])
    with pytest.raises(ConfigError, match="engine: the engine must be embedded"):
        load_config(TINY, ["evaluator=localhost:8000"])


# --- training -------------------------------------------------------------------------------------------------

# (sample -> the answer of each turn) for num_generations 2, turns 2: a success then a regression (void turn),
# and a format error then a success.
SCRIPT = [["triton", "wrong"], [None, "triton"]]
WRONG = {"1_vector_add": "wrong_offset", "2_relu": "wrong"}


def _scripted_generate(tokenizer, logprobs=False):
    """The script's answers; with `logprobs`, sampling log-probs of 0 (probability 1), which MRS must reject."""

    def generate(contexts):
        out = []
        for i, ids in enumerate(contexts):
            text = tokenizer.decode(ids)
            task = "2_relu" if "torch.relu" in text else "1_vector_add"
            turn = text.count("<|im_start|>assistant")
            kind = SCRIPT[i % 2][turn - 1]
            if kind is None:
                body = "I am not sure."
            else:
                body = "```python\n" + (CANDIDATES / f"{task}__{WRONG[task] if kind == 'wrong' else kind}.py").read_text() + "```"
            out.append(tokenizer(body, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        return out, [[0.0] * len(ids) for ids in out] if logprobs else None

    return generate


def _two_tasks(tmp_path):
    """A task folder of examples/ 1_vector_add and 2_relu."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("1_vector_add", "2_relu"):
        shutil.copy(REPO / "examples" / "tasks" / f"{name}.py", tasks)
    return tasks


def _read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_a_step_with_a_gradient_not_finite_updates_nothing_and_says_so():
    from types import SimpleNamespace

    from drkernel.train.trainer import NonFiniteUpdateGuard

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    trainer = SimpleNamespace(_step_metrics={})
    guard = NonFiniteUpdateGuard(trainer)

    def step(poison: bool) -> dict:
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        optimizer.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        if poison:  # one element of one tensor, as a NaN norm leaves after clipping
            model[1].bias.grad[0] = float("nan")
        guard.on_pre_optimizer_step(None, SimpleNamespace(global_step=3), None, model=model, optimizer=optimizer)
        optimizer.step()
        return {n: not torch.equal(before[n], p) for n, p in model.named_parameters()}

    assert all(step(poison=False).values()) and trainer._step_metrics["update_skipped"] is False
    moments = {k: v["exp_avg"].clone() for k, v in enumerate(optimizer.state.values())}
    assert not any(step(poison=True).values()) and trainer._step_metrics["update_skipped"] is True
    assert all(torch.equal(moments[k], v["exp_avg"]) for k, v in enumerate(optimizer.state.values()))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(step(poison=False).values()) and trainer._step_metrics["update_skipped"] is False

    with torch.no_grad():  # weights already poisoned (a checkpoint written after such an update): refused
        model[0].weight[0, 0] = float("inf")
    with pytest.raises(RuntimeError, match="1 trainable tensors hold NaN or inf before training .*0.weight"):
        guard.on_train_begin(None, None, None, model=model)


@pytest.mark.slow
def test_two_steps_then_resume(tmp_path, monkeypatch, tiny_policy):
    from transformers import AutoTokenizer

    from drkernel.train import run as run_module
    from drkernel.train.trainer import DrKernelTrainer

    tasks = _two_tasks(tmp_path)
    out = tmp_path / "run"
    samples = tmp_path / "samples.jsonl"
    settings = [f"tasks={tasks}", f"output_dir={out}", f"model={tiny_policy}", "turns=2", "num_generations=2",
                "per_device_train_batch_size=4", "prs=true", "validation_every=2", f"validation_tasks={tasks}",
                f"log_samples={samples}"]
    config = load_config(TINY, settings)

    captured = {"loss": [], "scored": []}
    original_loss, original_score = DrKernelTrainer._compute_loss, DrKernelTrainer._generate_and_score_completions

    def compute_loss(self, model, inputs):
        captured["loss"].append((self.state.global_step + 1, {k: inputs[k].detach().clone() for k in
                                 ("prompt_ids", "completion_ids", "advantages", "tool_mask", "completion_mask")}))
        return original_loss(self, model, inputs)

    def score(self, inputs):
        output = original_score(self, inputs)
        captured["scored"].append((self.state.global_step + 1, list(self._trajectories)))
        return output

    monkeypatch.setattr(DrKernelTrainer, "_compute_loss", compute_loss)
    monkeypatch.setattr(DrKernelTrainer, "_generate_and_score_completions", score)
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    trainer = run_module.train(config, generate=_scripted_generate(tokenizer))
    assert trainer.state.global_step == 2

    # metrics.jsonl: one line per step with the contract's keys
    metrics = _read(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["turn_correct"] == [0.5, 0.5]  # turn 1: the success; turn 2: the repair
        assert m["kept_void_turn"] == 0.75 and m["kept_prs"] == 0.5 and m["kept_mrs"] == 1.0
        assert m["evaluations"] == 6 and m["tokens"] > 0
        # on the CPU a correct turn's coverage is not measured: its kind is `unmeasured`, every other turn `failed`
        assert m["kind_shares"] == {"lazy": 0.0, "partial": 0.0, "unfused": 0.0, "fused": 0.0, "unmeasured": 0.5,
                                    "failed": 0.5}
        assert m["turn_kind_shares"] == [m["kind_shares"]] * 2  # each turn: one success, one failure
        assert all(m[k] >= 0 for k in ("time_generation_s", "time_evaluation_s", "time_update_s"))
        assert m["update_skipped"] is False  # the guard against non-finite gradients ran before each update

    # validation at step 2: the agent loop with the model being trained, its records where `drkernel report` reads a
    # bench run. Its requests are generated in batches, so which of the script's samples a trajectory's turn gets
    # depends on its row in a batch: the figures are checked against the records, not against one script.
    assert "validation" not in metrics[0]
    validation = metrics[1]["validation"]
    assert set(validation) == {"correct", "fast_1", "fast_1_2", "turn_fast_1", "turn_fast_1_2",
                               "best_of_history_fast_1_2"}
    assert validation["fast_1_2"] == 0.0 and validation["turn_fast_1_2"] == [0.0, 0.0]  # no speed on the CPU
    from drkernel.agent.records import read_trajectories

    from drkernel.agent.config import BenchConfig

    step_dir = out / "validation" / "step_2"
    assert json.loads((step_dir / "summary.json").read_text())["last_turn"]["correct"] == validation["correct"]
    assert BenchConfig.from_dict(json.loads((step_dir / "config.json").read_text())).turns == 2
    records = read_trajectories(step_dir)
    assert sorted((r.task, r.turn) for r in records) == [("1_vector_add", 1), ("1_vector_add", 2), ("2_relu", 1),
                                                         ("2_relu", 2)]
    last = [r for r in records if r.turn == 2]
    assert validation["correct"] == sum(r.status == "correct" for r in last) / len(last)
    # the policy it validated, saved beside: model selection's candidate; the policy's entropy on every step
    from drkernel.train.selection import select_policy

    assert any((step_dir / "policy").glob("*.safetensors")) and select_policy(out).step == 2
    assert all(m["policy_entropy"] > 0 for m in metrics)
    record = json.loads((out / "run_record.json").read_text())
    assert (record["kind"], record["seed"], record["config"]["validation_every"], len(record["starts"])) == (
        "rl", 0, 2, 1)

    # --log-samples: advantages are drkernel.rl's TRLOO over (prompt, turn) groups of the logged returns
    rows = _read(samples)
    assert len(rows) == 2 * 2 * 2 * 2  # steps x prompts x samples x turns
    # each line carries the answer it logs: the script's candidate file, or none where the answer had no code
    candidates = {p.read_text().strip() for p in CANDIDATES.glob("*.py")}
    assert all(r["code"] is None or r["code"].strip() in candidates for r in rows)
    assert any(r["code"] for r in rows) and all((r["code"] is None) == (r["status"] == "format_error") for r in rows)
    # and why each failed: the error's kind (a mismatch here), none where it passed or held no code
    assert all(r["reasons"] == ([] if r["status"] in ("correct", "format_error") else ["Mismatch"]) for r in rows)
    for step in (1, 2):
        mine = [r for r in rows if r["step"] == step]
        returns = [r["return"] for r in mine]
        want = trloo_advantages(returns, [r["prompt_id"] for r in mine], [r["turn"] for r in mine])
        assert [r["advantage"] for r in mine] == pytest.approx(want.tolist(), abs=1e-12)
        by_traj = {}
        for r in mine:
            by_traj.setdefault((r["prompt_id"], r["sample"]), []).append(r)
        for turns in by_traj.values():
            turns.sort(key=lambda r: r["turn"])
            assert [r["return"] for r in turns] == reward_to_go([r["reward"] for r in turns]).tolist()
            # PRS (coverage unmeasured on a CPU) drops every correct turn; the void-turn rule the regression
            for k, r in enumerate(turns):
                void = r["reward"] <= 0 and any(e["reward"] > 0 for e in turns[:k])
                assert r["why_not"] == ("prs" if r["correct"] else "void_turn" if void else None)
                assert r["kept"] == (r["why_not"] is None)
        # the step's mean advantage per kind is that of the turns the loss kept (none of the successes here)
        kept = [r for r in mine if r["kept"]]
        assert {r["kind"] for r in kept} == {"failed"}
        assert metrics[step - 1]["advantage_by_kind"] == {
            "lazy": None, "partial": None, "unfused": None, "fused": None, "unmeasured": None,
            "failed": pytest.approx(sum(r["advantage"] for r in kept) / len(kept), abs=1e-12)}

    # the advantage reaching the loss for each turn's tokens is that turn's; dropped turns and feedback are masked
    logged = {(r["step"], r["task"], r["sample"], r["turn"]): r for r in rows}
    checked = 0
    for step, trajectories in captured["scored"]:
        batches = [b for s, b in captured["loss"] if s == step]
        for sample, traj in enumerate(trajectories):
            key = (traj.prompt_ids, traj.completion_ids)
            for b in batches:
                for row in range(b["completion_ids"].shape[0]):
                    ids = b["completion_ids"][row][: len(traj.completion_ids)].tolist()
                    if (b["prompt_ids"][row][b["prompt_ids"][row] != tokenizer.pad_token_id].tolist(), ids) != key:
                        continue
                    env = torch.tensor(traj.env_mask, dtype=torch.bool)
                    assert not b["tool_mask"][row][: len(env)][~env].any()
                    for (start, end), record in zip(traj.spans, traj.records):
                        r = logged[(step, record.task, record.sample, record.turn)]
                        assert torch.all(b["advantages"][row, start:end] == torch.tensor(r["advantage"], dtype=torch.float32))
                        assert torch.all(b["tool_mask"][row, start:end] == int(r["kept"]))
                        checked += 1
    assert checked == len(rows)

    # a model that does not load, and --resume without a checkpoint, are clear errors
    with pytest.raises(ConfigError, match="model '/nonexistent/model' does not load"):
        run_module.load_policy(load_config(TINY, ["model=/nonexistent/model"]), [])

    from typer.testing import CliRunner

    from drkernel.cli.main import app

    result = CliRunner().invoke(app, ["train", "--config", str(TINY), "--set", f"output_dir={tmp_path / 'none'}", "--resume"])
    assert result.exit_code == 2
    assert f"--resume: no checkpoint in {tmp_path / 'none'}" in " ".join(result.output.replace("\n", "").split())

    # a checkpoint cut while being saved (a time limit's SIGTERM): its weights are there, its trainer state is not;
    # resuming skips it, and a folder with nothing whole says which folder to delete
    cut = out / "checkpoint-3"
    cut.mkdir()
    shutil.copy(next((out / "checkpoint-2").glob("*.safetensors")), cut)
    assert (run_module.last_checkpoint(out), run_module.cut_checkpoints(out)) == (str(out / "checkpoint-2"), [str(cut)])
    lone = tmp_path / "lone"
    shutil.copytree(cut, lone / "checkpoint-1")
    (lone / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": ')  # written halfway
    with pytest.raises(ConfigError, match=f"no checkpoint in {lone} that is whole \\({lone / 'checkpoint-1'}: no "
                                          "readable trainer_state.json, the run stopped while saving; delete it"):
        run_module.train(load_config(TINY, settings + [f"output_dir={lone}"]), resume=True)

    # resume: one more step from checkpoint-2, with GRPO and MRS this time; step count and optimizer state continue
    config = load_config(TINY, settings + ["max_steps=3", "advantage_estimator=grpo", "mrs=true"])
    trainer = run_module.train(config, resume=True, generate=_scripted_generate(tokenizer, logprobs=True))
    assert trainer.state.global_step == 3
    adam_steps = {int(s["step"]) for s in trainer.optimizer.state_dict()["state"].values()}
    assert adam_steps == {3}  # a fresh optimizer would be at 1
    metrics = _read(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [start["resumed"] for start in json.loads((out / "run_record.json").read_text())["starts"]] == [False, True]
    assert (metrics[2]["kept_mrs"], metrics[2]["kept_prs"], metrics[2]["kept_void_turn"]) == (0.0, 0.5, 0.75)
    mine = [r for r in _read(samples) if r["step"] == 3]
    assert [r["why_not"] for r in mine] == ["mrs"] * 8  # the first rule that dropped each turn
    want = grpo_advantages([r["return"] for r in mine], [r["prompt_id"] for r in mine], [r["turn"] for r in mine])
    assert [r["advantage"] for r in mine] == pytest.approx(want.tolist(), abs=1e-12)


def test_training_config_error_from_the_cli(tmp_path):
    from typer.testing import CliRunner

    from drkernel.cli.main import app

    result = CliRunner().invoke(app, ["train", "--config", str(TINY), "--set", "nope=1"])
    assert result.exit_code == 2
    assert "unknown config key(s) nope" in result.output


def test_a_step_that_draws_more_prompts_than_there_are_tasks_is_an_error(tmp_path, monkeypatch):
    """TRL's sampler yields whole steps only, so 4 prompts a step over 2 tasks trained 0 steps and exited 0."""
    from drkernel.train import run as run_module

    tasks = _two_tasks(tmp_path)
    settings = [f"tasks={tasks}", f"output_dir={tmp_path / 'run'}", "num_generations=4",
                "per_device_train_batch_size=8", "gradient_accumulation_steps=2"]
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # one process
    with pytest.raises(ConfigError, match=r"a step draws 4 prompts \(per_device_train_batch_size 8 x "
                                          r"gradient_accumulation_steps 2 x 1 process\(es\) / num_generations 4\), "
                                          rf"and {tasks} holds 2 task\(s\)"):
        run_module.train(load_config(TINY, settings))
    assert not (tmp_path / "run").exists()  # refused before anything was written
    monkeypatch.setenv("WORLD_SIZE", "2")  # two processes draw twice the prompts
    assert run_module.prompts_per_step(load_config(TINY, settings)) == 8


def test_a_used_output_dir_is_refused_and_resume_past_max_steps_is_an_error(tmp_path):
    """A second fresh run in a used folder would mix its metrics with the first one's checkpoints (friction 1)."""
    from drkernel.train import run as run_module

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match="already holds a training run; pass --resume"):
        run_module.train(load_config(TINY, [f"output_dir={out}"]))
    (out / "checkpoint-2").mkdir()
    (out / "checkpoint-2" / "trainer_state.json").write_text("{}")
    with pytest.raises(ConfigError, match="already at step 2, and max_steps is 1"):
        run_module.train(load_config(TINY, [f"output_dir={out}", "max_steps=1"]), resume=True)
