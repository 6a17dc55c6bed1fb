"""Local models as `hf:PATH` takes them: a saved folder, a GGUF file, or a folder holding one GGUF.

The GGUF is written here with the `gguf` package from a tiny random Llama (float32 tensors, q/k permuted as
llama.cpp's converter does), so loading it back must give the same logits and the same chat tokens.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drkernel.agent.local_models import ModelSource, load_causal_lm, load_tokenizer, locate
from drkernel.cli.main import app

CONTROL, NORMAL = 3, 1  # llama.cpp's token types


def tiny_llama(path: Path) -> Path:
    from drkernel.train.policy import PolicyShape, build_policy

    texts = ["import torch\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"] * 4
    return build_policy(path, texts, PolicyShape(arch="llama", vocab_size=320, hidden_size=32, intermediate_size=64,
                                                 num_layers=2, num_heads=4, num_kv_heads=2))


def _permute(weights, heads: int):
    """llama.cpp's reordering of a q or k projection's rows (rotary halves interleaved), which loaders undo."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


def write_gguf(model_dir: Path, out: Path) -> Path:
    """The saved Llama at `model_dir` as a float32 GGUF with its byte-level BPE tokenizer and chat template."""
    gguf = pytest.importorskip("gguf")
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    config = model.config
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    specials = {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([CONTROL if token in specials else NORMAL for token, _ in vocab])
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([" ".join(pair) if isinstance(pair, list) else pair for pair in merges])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_chat_template(tokenizer.chat_template)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":  # tied to the embeddings: a GGUF without output.weight says so
            continue
        weights = tensor.float().numpy()
        if name.endswith("q_proj.weight"):
            weights = _permute(weights, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            weights = _permute(weights, config.num_key_value_heads)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """(the saved tiny Llama, a folder holding it as the only GGUF)."""
    root = tmp_path_factory.mktemp("tiny")
    source = tiny_llama(root / "source")
    (root / "gguf").mkdir()
    write_gguf(source, root / "gguf" / "tiny.gguf")
    return source, root / "gguf"


def test_locate_names_what_from_pretrained_takes(tmp_path):
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "config.json").write_text("{}")
    (tmp_path / "saved" / "stray.gguf").write_bytes(b"")  # a saved model's config wins over a GGUF beside it
    assert locate(str(tmp_path / "saved")) == ModelSource(str(tmp_path / "saved"))
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "m.gguf").write_bytes(b"")
    assert locate(str(tmp_path / "one")) == ModelSource(str(tmp_path / "one"), "m.gguf")
    assert locate(str(tmp_path / "one" / "m.gguf")) == ModelSource(str(tmp_path / "one"), "m.gguf")
    assert locate("HuggingFaceTB/SmolLM2-135M-Instruct") == ModelSource("HuggingFaceTB/SmolLM2-135M-Instruct")
    (tmp_path / "one" / "n.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="holds 2 GGUF files \\(m.gguf, n.gguf\\); name one"):
        locate(str(tmp_path / "one"))
    with pytest.raises(ValueError, match="must be a GGUF"):
        locate(str(tmp_path / "saved" / "config.json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="neither a saved model"):
        locate(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="no such file or folder"):
        locate(str(tmp_path / "missing"))


def test_a_gguf_loads_as_the_model_it_was_written_from(tiny):
    torch = pytest.importorskip("torch")
    source, folder = tiny
    reference = load_causal_lm(str(source))
    tokenizer = load_tokenizer(str(source))
    chat = [{"role": "user", "content": "class ModelNew"}]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    for path in (folder, folder / "tiny.gguf"):
        model = load_causal_lm(str(path))
        assert not hasattr(model.config, "quantization_config")  # trainable and savable
        assert model.name_or_path == str(folder / "tiny.gguf")
        from_gguf = load_tokenizer(str(path))
        assert from_gguf.eos_token == tokenizer.eos_token
        again = from_gguf.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        assert again["input_ids"].tolist() == ids["input_ids"].tolist()
        with torch.no_grad():
            torch.testing.assert_close(model(**ids).logits, reference(**ids).logits, rtol=0, atol=1e-5)
    assert load_causal_lm(str(folder), dtype="bfloat16").dtype == torch.bfloat16


def test_an_adapter_loads_merged_into_its_base_even_an_adapter(tiny, tmp_path):
    """A LoRA adapter over the GGUF, and one over that adapter: each loads as its base with the adapter merged."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from drkernel.train.lora import lora_config

    _, folder = tiny
    ids = torch.tensor([[5, 6, 7, 8]])
    base = str(folder / "tiny.gguf")
    for name in ("first", "second"):
        with torch.no_grad():
            before = load_causal_lm(base)(ids).logits
        adapted = peft.get_peft_model(load_causal_lm(base), lora_config(4))
        torch.manual_seed(len(name))
        for parameter_name, parameter in adapted.named_parameters():
            if "lora_B" in parameter_name:  # zero at initialisation: a trained adapter's are not
                torch.nn.init.normal_(parameter, std=0.5)
        adapted.save_pretrained(tmp_path / name)
        assert locate(str(tmp_path / name)) == ModelSource(str(tmp_path / name), adapts=base)
        merged = load_causal_lm(str(tmp_path / name))
        with torch.no_grad():
            expected = adapted(input_ids=ids).logits
            torch.testing.assert_close(merged(ids).logits, expected, rtol=1e-4, atol=1e-4)
            assert not torch.allclose(expected, before, atol=1e-3)
        assert merged.name_or_path == str(tmp_path / name)
        assert load_tokenizer(str(tmp_path / name)).get_vocab() == load_tokenizer(str(folder)).get_vocab()
        base = str(tmp_path / name)
    (tmp_path / "first" / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match="does not name the model it adapts"):
        locate(str(tmp_path / "first"))


def test_convert_writes_a_folder_that_loads_like_the_gguf(tiny, tmp_path):
    torch = pytest.importorskip("torch")
    _, folder = tiny
    result = CliRunner().invoke(app, ["pretrained", "convert", str(folder), str(tmp_path / "hf"), "--dtype", "float32"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "hf" / "config.json").exists() and (tmp_path / "hf" / "tokenizer.json").exists()
    assert "quantization_config" not in json.loads((tmp_path / "hf" / "config.json").read_text())
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        torch.testing.assert_close(load_causal_lm(str(tmp_path / "hf"))(ids).logits,
                                   load_causal_lm(str(folder))(ids).logits, rtol=0, atol=0)
    refused = CliRunner().invoke(app, ["pretrained", "convert", str(folder), str(tmp_path / "hf")])
    assert refused.exit_code == 2 and "already exists" in " ".join(refused.output.split())


def test_convert_takes_the_end_of_turn_token_from_the_generation_config(tiny, tmp_path):
    """transformers 5.17 reads SmolLM2's GGUF with eos `<|im_start|>` and no pad token; the converted folder's
    tokenizer ends a turn where the model does, since rollouts cut answers at the tokenizer's eos."""
    from types import SimpleNamespace

    from drkernel.train.pretrained import _end_of_turn_from

    _, folder = tiny
    tokenizer = load_tokenizer(str(folder))
    right = tokenizer.eos_token_id
    wrong = next(i for i in sorted(tokenizer.all_special_ids) if i != right)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(wrong)
    tokenizer.pad_token = None
    _end_of_turn_from(SimpleNamespace(eos_token_id=[right]), tokenizer)
    assert tokenizer.eos_token_id == right and tokenizer.pad_token_id == right


def test_every_local_model_consumer_takes_a_gguf(tiny, tmp_path):
    """bench's `hf:` backend, `drkernel train`'s policy and the SFT's starting policy all load the GGUF."""
    from drkernel.agent.backends import HFChatModel, SamplingParams
    from drkernel.train.config import TrainConfig
    from drkernel.train.run import load_policy
    from drkernel.train.sft import SFTRunConfig, sft_trainer

    source, folder = tiny
    messages = [{"role": "user", "content": "class ModelNew"}]
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    answers = []
    for path in (source, folder):
        backend = HFChatModel(str(path))
        answers.append(asyncio.run(backend.complete(messages, greedy)))
        asyncio.run(backend.close())
    assert answers[0].text == answers[1].text and answers[0].usage == answers[1].usage

    model, tokenizer = load_policy(TrainConfig(model=str(folder / "tiny.gguf"), output_dir=str(tmp_path / "rl")), [])
    assert tokenizer.chat_template and model.config.model_type == "llama"

    rows = [{"prompt": messages, "completion": [{"role": "assistant", "content": "return x"}]}]
    trainer = sft_trainer(SFTRunConfig(data="", output_dir=str(tmp_path / "sft"), use_cpu=True, max_steps=1),
                          rows, str(folder))
    assert trainer.model.config.model_type == "llama" and trainer.processing_class.chat_template
