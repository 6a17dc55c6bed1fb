"""Concurrent chat requests answered in batches: the batcher local models share, and validation's model during
training (its trajectories' requests were answered one at a time)."""

from __future__ import annotations

import asyncio

import pytest

from drkernel.agent.backends import ChatRequest, Completion, CompletionBatcher, GenerationError, SamplingParams
from drkernel.train.validation import TrainerChatModel

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
SAMPLED = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16)


def ask_together(model, prompts: list[str], params: list[SamplingParams]) -> list:
    async def everything() -> list:
        return await asyncio.gather(*(model.complete([{"role": "user", "content": p}], q)
                                      for p, q in zip(prompts, params)), return_exceptions=True)
    return asyncio.run(everything())


def test_requests_in_flight_together_are_one_batch_per_sampling_setting() -> None:
    batches: list[list[str]] = []

    def answer(batch: list[ChatRequest]) -> list[Completion]:
        batches.append([r.messages[0]["content"] for r in batch])
        return [Completion(r.messages[0]["content"].upper(), {}, "stop") for r in batch]

    batcher = CompletionBatcher(answer, max_batch=8, batch_wait_s=0.2)
    prompts = [f"p{i}" for i in range(6)]
    done = ask_together(batcher, prompts, [GREEDY, SAMPLED] * 3)
    assert [c.text for c in done] == [p.upper() for p in prompts]  # each its own answer, in order
    assert sorted(map(sorted, batches)) == [["p0", "p2", "p4"], ["p1", "p3", "p5"]]
    batcher.close()
    with pytest.raises(GenerationError, match="closed"):
        asyncio.run(batcher.complete([], GREEDY))


def test_a_failed_generation_is_each_waiting_requests_error() -> None:
    def answer(batch: list[ChatRequest]) -> list[Completion]:
        raise RuntimeError("CUDA out of memory")

    batcher = CompletionBatcher(answer, max_batch=4, batch_wait_s=0.2)
    done = ask_together(batcher, ["a", "b"], [GREEDY, GREEDY])
    assert all(isinstance(e, GenerationError) and "CUDA out of memory" in str(e) for e in done)
    with pytest.raises(ValueError):
        CompletionBatcher(answer, max_batch=0)


class Tokenizer:
    """Characters as token ids; 0 ends an answer."""

    eos_token_id = 0

    def apply_chat_template(self, messages, tokenize, add_generation_prompt) -> str:
        return "".join(m["content"] for m in messages)

    def __call__(self, text: str, add_special_tokens: bool) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return "".join(chr(i) for i in ids)


@pytest.mark.parametrize("fill", [False, True])
def test_validation_generates_its_trajectories_requests_in_one_call(fill: bool) -> None:
    calls: list[int] = []

    def generate(contexts: list[list[int]]):
        calls.append(len(contexts))  # each answer: its context reversed, then EOS (except for "cut")
        return [list(reversed(c)) + ([] if c == [ord(x) for x in "cut"] else [0, 99]) for c in contexts], None

    model = TrainerChatModel(Tokenizer(), generate, max_batch=8, fill=fill)
    model.batcher.batch_wait_s = 0.2
    done = ask_together(model, ["ab", "cd", "cut", "ef"], [SAMPLED] * 4)
    assert calls == [8 if fill else 4]  # one call; filled to one batch size for a static cache
    assert [c.text for c in done] == ["ba", "dc", "tuc", "fe"]  # cut at the end of the answer, in order
    assert [c.finish_reason for c in done] == ["stop", "stop", "length", "stop"]
    assert done[0].usage == {"prompt_tokens": 2, "completion_tokens": 3}
    asyncio.run(model.close())
