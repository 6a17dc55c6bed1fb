"""`--model hf:PATH`: a tiny random causal LM and a tokenizer trained here, driven by `drkernel bench`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drkernel.agent.backends import GenerationError, HFChatModel, SamplingParams
from drkernel.agent.records import read_trajectories
from drkernel.cli.main import app
from drkernel.sandbox.gate import DeviceGate

REPO = Path(__file__).resolve().parents[1]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def tiny_model(path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    specials = ["<|end|>", "<|user|>", "<|assistant|>", "<unk>"]
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    corpus = [(REPO / "examples" / "tasks" / "2_relu.py").read_text(), "class ModelNew triton kernel python"]
    tokenizer.train_from_iterator(corpus, tokenizers.trainers.WordLevelTrainer(special_tokens=specials))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|end|>", unk_token="<unk>",
                                                pad_token="<|end|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    config = transformers.LlamaConfig(vocab_size=len(fast), hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                      max_position_embeddings=4096, eos_token_id=fast.eos_token_id,
                                      pad_token_id=fast.pad_token_id)
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)  # the same random model, hence the same answers, every run
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)


@pytest.mark.slow
def test_hf_backend_generates_and_runs_the_loop(tmp_path):
    tiny_model(tmp_path / "model")
    model = HFChatModel(str(tmp_path / "model"))
    messages = [{"role": "user", "content": "write a triton kernel"}]
    completion = asyncio.run(model.complete(messages, SamplingParams(max_tokens=4, temperature=0.0)))
    assert completion.usage["prompt_tokens"] == 7  # <|user|> write a triton kernel <|end|> <|assistant|>
    assert 1 <= completion.usage["completion_tokens"] <= 4
    again = asyncio.run(model.complete(messages, SamplingParams(max_tokens=4, temperature=0.0)))
    assert again.text == completion.text  # greedy decoding repeats itself

    result = CliRunner().invoke(app, [
        "bench", "--tasks", str(REPO / "examples" / "tasks"), "--name", "2_relu", "--model",
        f"hf:{tmp_path / 'model'}", "--turns", "2", "--max-tokens", "6", "--seed", "3", "--device", "cpu",
        "--out", str(tmp_path / "run"),
    ])
    assert result.exit_code == 0, result.output
    records = read_trajectories(tmp_path / "run")
    assert [(r.turn, r.status, r.context_turns) for r in records] == [(1, "format_error", []), (2, "format_error", [1])]
    assert all(0 < r.usage["completion_tokens"] <= 6 for r in records)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "model"
    tiny_model(path)
    return str(path)


PROMPTS = ["write a triton kernel", "class ModelNew", "write a triton kernel for the relu of a tensor x in python"]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


def count_generate_calls(model: HFChatModel) -> list[int]:
    calls, generate = [], model.model.generate

    def counted(input_ids, **kwargs):
        calls.append(input_ids.shape[0])
        return generate(input_ids, **kwargs)

    model.model.generate = counted
    return calls


async def ask_together(model: HFChatModel, prompts: list[str], params: SamplingParams, seeds=None):
    seeds = seeds or [None] * len(prompts)
    return await asyncio.gather(*(model.complete([{"role": "user", "content": p}], params, seed=seed)
                                  for p, seed in zip(prompts, seeds)), return_exceptions=True)


def test_concurrent_requests_share_one_generate_call_and_match_lone_answers(model_path):
    model = HFChatModel(model_path, max_batch=len(PROMPTS), batch_wait_s=0.0)
    alone = [asyncio.run(ask_together(model, [prompt], GREEDY))[0] for prompt in PROMPTS]
    calls = count_generate_calls(model)
    model.batch_wait_s = 2.0  # the batch is full, hence taken, as soon as the three requests are queued
    together = asyncio.run(ask_together(model, PROMPTS, GREEDY, seeds=[5, 6, 7]))  # greedy: the seed changes nothing
    assert calls == [3]  # one left-padded batch
    assert together == alone  # padding changes neither the text nor the per-row usage
    assert [c.usage["prompt_tokens"] for c in together] == [7, 5, 16]
    assert all(1 <= c.usage["completion_tokens"] <= 8 for c in together)

    # rows that end at different steps: the second word the first prompt is answered with becomes an EOS too
    word_id = model.tokenizer.convert_tokens_to_ids(alone[0].text.split()[1])
    model.model.generation_config.eos_token_id = [model.tokenizer.eos_token_id, word_id]
    model.batch_wait_s = 0.0
    alone = [asyncio.run(ask_together(model, [prompt], GREEDY))[0] for prompt in PROMPTS]
    model.batch_wait_s = 2.0
    assert alone[0].usage["completion_tokens"] <= 2 and alone[0].finish_reason == "stop"
    together = asyncio.run(ask_together(model, PROMPTS, GREEDY))
    assert together == alone
    assert len({c.usage["completion_tokens"] for c in together}) > 1  # some rows stopped before others


def test_seeded_sampled_requests_share_a_batch_and_repeat_their_lone_answers(model_path):
    model = HFChatModel(model_path, max_batch=3, batch_wait_s=0.0)
    sampled = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.95)
    prompts, seeds = [PROMPTS[0], PROMPTS[0], PROMPTS[2]], [11, 12, 13]
    alone = [asyncio.run(ask_together(model, [p], sampled, seeds=[seed]))[0] for p, seed in zip(prompts, seeds)]
    calls = count_generate_calls(model)
    model.batch_wait_s = 2.0
    assert asyncio.run(ask_together(model, prompts, sampled, seeds=seeds)) == alone
    assert calls == [3]  # one batch, yet each row samples from its own seed
    assert alone[0].text != alone[1].text  # another seed, another sample


def test_a_static_cache_answers_as_the_dynamic_one_and_is_sized_in_rounded_steps(model_path):
    """The static cache (which transformers compiles on a GPU) changes the speed, not the answers: greedy and seeded
    sampled batches give the same completions; the cache it asks for holds the prompt and every new token."""
    from drkernel.agent.local_models import STATIC_CACHE_ROUNDING, static_cache_settings

    plain, static = (HFChatModel(model_path, max_batch=3, batch_wait_s=2.0, static_cache=s) for s in (False, True))
    sampled = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.95)
    asked = []
    generate = static.model.generate
    static.model.generate = lambda input_ids, **kwargs: asked.append(kwargs) or generate(input_ids, **kwargs)
    for params, seeds in ((GREEDY, None), (sampled, [11, 12, 13])):
        assert asyncio.run(ask_together(static, PROMPTS, params, seeds)) == asyncio.run(
            ask_together(plain, PROMPTS, params, seeds))
    assert [(k["cache_implementation"], k["max_cache_len"]) for k in asked] == [("static", STATIC_CACHE_ROUNDING)] * 2
    rows = []
    static.model.generate = lambda input_ids, **kwargs: rows.append(input_ids.shape[0]) or generate(input_ids, **kwargs)
    for params, seeds in ((GREEDY, None), (sampled, [11, 12])):  # two requests: a third row fills the batch
        assert asyncio.run(ask_together(static, PROMPTS[1:], params, seeds)) == asyncio.run(
            ask_together(plain, PROMPTS[1:], params, seeds))
    assert rows == [3, 3]  # one shape for the compiled step, whatever the batch holds
    assert static_cache_settings(STATIC_CACHE_ROUNDING + 1)["max_cache_len"] == 2 * STATIC_CACHE_ROUNDING


def test_generation_behind_the_device_gate_waits_for_a_timing_and_makes_way_every_step(model_path, tmp_path,
                                                                                       monkeypatch):
    lock = tmp_path / "gate-gpu-0"
    model = HFChatModel(model_path, batch_wait_s=0.0, gate=DeviceGate(lock, None))
    plain = HFChatModel(model_path, batch_wait_s=0.0)
    steps: list[int] = []
    make_way = DeviceGate.make_way
    monkeypatch.setattr(DeviceGate, "make_way", lambda gate, sync: (steps.append(1), make_way(gate, sync)))
    timer = DeviceGate(lock, None)
    with timer.exclusive():  # a candidate is being timed: generation does not start
        answer = concurrent.futures.ThreadPoolExecutor(1).submit(asyncio.run, ask_together(model, PROMPTS[:1], GREEDY))
        time.sleep(0.5)
        assert not answer.done()
    (completion,) = answer.result(timeout=60)
    assert completion == asyncio.run(ask_together(plain, PROMPTS[:1], GREEDY))[0]  # the gate changes no token
    assert len(steps) == completion.usage["completion_tokens"]  # one chance for a timing per decoding step


def test_a_local_model_shares_the_gate_of_the_embedded_scheduler_s_gpu(monkeypatch, tmp_path):
    from drkernel.agent import bench
    from drkernel.runner.supervisor import Supervisor
    from drkernel.scheduling.engine import EngineConfig
    from drkernel.schema import EvalOptions

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    monkeypatch.setattr(bench, "discover_gpus", lambda: ["3", "5"])
    config = bench.BenchConfig(tasks="t", model="hf:/m", evaluation=EvalOptions(device="cuda"))
    gate = bench.generation_gate(config)
    assert gate is not None and gate.path == Supervisor(device="cuda", gpu="3").gate  # the GPU it is on
    for other in (dataclasses.replace(config, evaluation=EvalOptions(device="cpu")),
                  dataclasses.replace(config, model="m", base_url="u"),
                  dataclasses.replace(config, engine=EngineConfig("http://x:8000"))):  # no shared GPU, or elsewhere
        assert bench.generation_gate(other) is None


def test_a_local_model_batches_every_trajectory_in_flight(model_path):
    from drkernel.agent import bench

    config = bench.BenchConfig(tasks="t", model=f"hf:{model_path}", concurrency=128, static_cache=True)
    for trajectories, batch in ((None, 128), (32 * 4, 128), (32, 32)):  # a static cache pads each batch to it
        model = bench.make_model(config, trajectories)
        try:
            assert (model.max_batch, model.static_cache) == (batch, True)
        finally:
            asyncio.run(model.close())


def test_a_failing_generate_reaches_every_waiting_request(model_path):
    model = HFChatModel(model_path, max_batch=len(PROMPTS), batch_wait_s=2.0)

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory")

    model.model.generate = out_of_memory
    answers = asyncio.run(ask_together(model, PROMPTS, GREEDY))
    assert [type(a) for a in answers] == [GenerationError] * 3
    assert {str(a) for a in answers} == {"local generation failed: RuntimeError: CUDA out of memory"}
    asyncio.run(model.close())
    with pytest.raises(GenerationError, match="the local model was closed"):
        asyncio.run(model.complete([{"role": "user", "content": "x"}], GREEDY))
