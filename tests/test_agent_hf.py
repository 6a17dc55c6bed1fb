"""`--model hf:PATH`: a tiny random causal LM and a tokenizer trained here, driven by `drkernel bench`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drkernel.agent.backends import HFChatModel, SamplingParams
from drkernel.agent.records import read_trajectories
from drkernel.cli.main import app

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
