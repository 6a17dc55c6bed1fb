"""How fast a local policy generates through `HFChatModel`'s path (docs/miniature.md).

    python benchmarks/generation_speed.py MODEL [--rows 32] [--tokens 256] [--device cuda] [--out FILE]
                                          [--dtypes float32 bfloat16] [--static-cache] [--lora-rank R]

The miniature's budget is mostly generation: this times `generate` per new-token step for one left-padded batch:
greedy first (the first call of a variant pays CUDA's and the kernels' start-up, and with a static cache on a GPU
the compilation transformers then makes of the forward), then with transformers' own sampling and with the per-row
seeded sampler `HFChatModel` uses (`_RowSampler`). Every row is made to produce exactly `--tokens` tokens, so the
figures are per step of the whole batch. One run per weight dtype of `--dtypes`, each with the dynamic cache and,
with `--static-cache`, again with a static one (`static_cache_settings`, as `drkernel train` and `bench` use it):
what item 3 of issue 21 asks to choose between, measured in one run. `--lora-rank R` wraps the model in a fresh LoRA
adapter of that rank first, as `drkernel train` generates with it (every linear layer's adapter adds launches).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drkernel.agent.backends import _RowSampler  # noqa: E402
from drkernel.agent.local_models import load_causal_lm, load_tokenizer, locate, static_cache_settings  # noqa: E402
from drkernel.train.lora import lora_config  # noqa: E402


def step_ms(model, batch, tokens: int, **sampling) -> float:
    """Milliseconds per generated step of the whole batch."""
    sync = torch.cuda.synchronize if batch["input_ids"].is_cuda else (lambda: None)
    sync()
    started = time.perf_counter()
    with torch.no_grad():
        model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=tokens,
                       min_new_tokens=tokens, **sampling)
    sync()
    return (time.perf_counter() - started) / tokens * 1000


def measure(model_dir: str, rows: int, tokens: int, device: str, dtypes: list[str] | None = None,
            static_cache: bool = False, lora_rank: int = 0) -> dict:
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    tokenizer = load_tokenizer(model_dir, padding_side="left")
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    prompts = [[{"role": "user", "content": "Write a Triton kernel for this chain. " * (20 + i)}] for i in range(rows)]
    batch = tokenizer.apply_chat_template(prompts, add_generation_prompt=True, padding=True, return_tensors="pt",
                                          return_dict=True).to(device)
    runs = []
    for dtype in dtypes or ["auto"]:
        model = load_causal_lm(model_dir, dtype if dtype == "auto" else getattr(torch, dtype))
        if lora_rank:
            import peft

            model = peft.get_peft_model(model, lora_config(lora_rank))
        model = model.to(device).eval()
        for cache in ["dynamic", "static"] if static_cache else ["dynamic"]:
            settings = {"pad_token_id": tokenizer.pad_token_id,
                        **(static_cache_settings(batch["input_ids"].shape[1] + tokens) if cache == "static" else {})}
            row_sampler = [TemperatureLogitsWarper(1.0), TopPLogitsWarper(0.95),
                           _RowSampler([random.getrandbits(63) for _ in range(rows)], device)]
            runs.append({
                "dtype": str(model.dtype).removeprefix("torch."), "cache": cache,
                "first_call_ms_per_step": step_ms(model, batch, tokens, do_sample=False, **settings),
                "transformers_sampling_ms_per_step": step_ms(model, batch, tokens, do_sample=True, temperature=1.0,
                                                             top_p=0.95, top_k=0, **settings),
                "row_sampler_ms_per_step": step_ms(model, batch, tokens, do_sample=False,
                                                   logits_processor=row_sampler, **settings),
            })
        del model
    return {"model": model_dir, "device": device, "rows": rows, "tokens": tokens, "lora_rank": lora_rank,
            "prompt_tokens": int(batch["input_ids"].shape[1]), "runs": runs}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", help="what hf: takes: a saved folder, a GGUF or an adapter")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here as JSON")
    parser.add_argument("--dtypes", nargs="+", choices=["auto", "float32", "bfloat16", "float16"], default=["auto"],
                        help="weight dtypes, one run each (auto: the checkpoint's)")
    parser.add_argument("--static-cache", action="store_true",
                        help="each dtype again with a static cache (which transformers compiles on a GPU)")
    parser.add_argument("--lora-rank", type=int, default=0, help="wrap the model in a fresh LoRA adapter of this rank")
    args = parser.parse_args(argv)
    try:
        locate(args.model_dir)
    except ValueError as exc:
        parser.error(str(exc))
    figures = measure(args.model_dir, args.rows, args.tokens, args.device, args.dtypes, args.static_cache,
                      args.lora_rank)
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    main()
