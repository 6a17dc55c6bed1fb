"""Model backends: any OpenAI-compatible chat endpoint (vLLM, SGLang, OpenAI, gateways) and local transformers.

The endpoint client is plain httpx, async, so hundreds of requests can be in flight while the evaluator works.
Transient failures (429, 5xx, connection errors, timeouts) are retried with exponential backoff and jitter,
honouring Retry-After; what retrying cannot fix (a refused key, an unknown model, an unreachable server) stops the
run with a message naming the cause, instead of recording a failed turn for every trajectory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import email.utils
import os
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from drkernel.errors import DrkernelError, UsageError
from drkernel.agent.local_models import load_causal_lm, load_tokenizer, locate, static_cache_settings
from drkernel.tasks.loaders import require

if TYPE_CHECKING:
    from drkernel.sandbox.gate import DeviceGate

REQUEST_TAG_HEADER = "X-Drkernel-Request"  # "task/sample/turn": ignored by real servers, read by the scripted one
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 300.0


class GenerationError(DrkernelError, RuntimeError):
    """The model call failed for good for this turn (after retries): the turn is recorded as a generation error."""


class FatalGenerationError(GenerationError):
    """No later request can succeed either (wrong key, unknown model, unreachable server): the run stops."""


@dataclass
class SamplingParams:
    """Passed through to the model. The paper evaluates with temperature 1.0, top_p 0.95 and 8192 new tokens."""

    temperature: float = 1.0
    top_p: float = 0.95
    max_tokens: int = 8192
    stop: list[str] = field(default_factory=list)
    seed: int | None = None  # the run's seed; each request asks with its own (drkernel.agent.loop.request_seed)


@dataclass
class Completion:
    text: str
    usage: dict[str, int]  # prompt_tokens, completion_tokens
    finish_reason: str | None = None


class ChatModel(Protocol):
    async def complete(
        self, messages: list[dict[str, str]], params: SamplingParams, seed: int | None = None, tag: str = ""
    ) -> Completion: ...

    async def close(self) -> None: ...


@dataclass
class OpenAIChatConfig:
    base_url: str  # e.g. http://localhost:8000/v1
    model: str
    api_key_env: str = "OPENAI_API_KEY"  # no key is sent when the variable is unset (local servers need none)
    timeout_s: float = 600.0  # per request
    max_retries: int = 5
    backoff_s: float = 1.0  # first retry waits about this long, doubling each time
    max_backoff_s: float = 60.0


class OpenAIChatModel:
    """POST {base_url}/chat/completions with retries; usage taken from the response."""

    def __init__(self, config: OpenAIChatConfig) -> None:
        httpx = require("httpx", "agent", "talking to an OpenAI-compatible endpoint")
        self.config = config
        key = os.environ.get(config.api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._httpx = httpx
        self._answered = False  # whether the server ever answered: until then, refusing connections is fatal at once
        self._http = httpx.AsyncClient(
            base_url=config.base_url.rstrip("/") + "/", headers=headers, timeout=config.timeout_s,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )

    async def complete(
        self, messages: list[dict[str, str]], params: SamplingParams, seed: int | None = None, tag: str = ""
    ) -> Completion:
        body: dict[str, Any] = {
            "model": self.config.model, "messages": messages, "temperature": params.temperature,
            "top_p": params.top_p, "max_tokens": params.max_tokens,
        }
        if params.stop:
            body["stop"] = params.stop
        if seed is not None:
            body["seed"] = seed
        headers = {REQUEST_TAG_HEADER: tag} if tag else {}
        cause = ""
        for attempt in range(self.config.max_retries + 1):
            wait = self._backoff(attempt)
            try:
                response = await self._http.post("chat/completions", json=body, headers=headers)
            except self._httpx.ConnectError as exc:
                cause, unreachable = f"cannot connect to {self.config.base_url}: {exc or type(exc).__name__}", True
                if not self._answered:  # a wrong URL or a server not started: retrying for half a minute hides it
                    raise FatalGenerationError(cause)
            except self._httpx.TimeoutException as exc:
                cause, unreachable = f"no answer within {self.config.timeout_s:g} s ({type(exc).__name__})", False
            except self._httpx.TransportError as exc:
                cause, unreachable = f"connection failed: {type(exc).__name__}: {exc}", False
            else:
                self._answered = True
                if response.is_success:
                    return self._completion(response)
                cause, unreachable = self._refusal(response), False
                if response.status_code not in RETRY_STATUSES:
                    if response.status_code in (401, 403, 404):
                        raise FatalGenerationError(cause)
                    raise GenerationError(cause)
                wait = max(wait, _retry_after(response.headers.get("Retry-After")))
            if attempt < self.config.max_retries:
                await asyncio.sleep(wait)
        if unreachable:
            raise FatalGenerationError(f"{cause} (after {self.config.max_retries} retries)")
        raise GenerationError(f"{cause} (after {self.config.max_retries} retries)")

    def _backoff(self, attempt: int) -> float:
        """Exponential with full jitter, so many trajectories refused at once do not come back at once."""
        return random.uniform(0.5, 1.0) * min(self.config.max_backoff_s, self.config.backoff_s * 2 ** attempt)

    def _refusal(self, response: Any) -> str:
        where = f"{self.config.base_url} (model {self.config.model!r})"
        detail = response.text[:300].strip()
        if response.status_code in (401, 403):
            unset = "" if os.environ.get(self.config.api_key_env) else ", which is not set"
            return (f"{where} refused the API key from ${self.config.api_key_env}{unset} "
                    f"(HTTP {response.status_code}): {detail}")
        if response.status_code == 404:
            return f"{where}: model or endpoint not found (HTTP 404): {detail}"
        return f"{where} answered HTTP {response.status_code}: {detail}"

    def _completion(self, response: Any) -> Completion:
        try:
            data = response.json()
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise GenerationError(f"{self.config.base_url} sent a response that is not a chat completion: "
                                  f"{response.text[:300]!r}") from exc
        usage = data.get("usage") or {}
        return Completion(
            text=text,
            usage={"prompt_tokens": int(usage.get("prompt_tokens") or 0),
                   "completion_tokens": int(usage.get("completion_tokens") or 0)},
            finish_reason=choice.get("finish_reason"),
        )

    async def close(self) -> None:
        await self._http.aclose()


def _retry_after(value: str | None) -> float:
    """Seconds asked for by a Retry-After header (a number or an HTTP date), capped; 0 when absent or unreadable
    (a malformed header from a gateway must not end the run)."""
    if not value or not value.strip():
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, OverflowError):
            return 0.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


class _RowSampler:
    """Gumbel-max sampling with one random stream per row: the argmax of log-probabilities minus log(E), E drawn
    from Exp(1), is a sample of the distribution, so greedy decoding over these scores samples each row from its
    own seed alone, whatever else shares the batch."""

    def __init__(self, seeds: list[int], device: str) -> None:
        import torch

        self.generators = [torch.Generator(device).manual_seed(seed) for seed in seeds]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        exponential = torch.stack([torch.empty_like(scores[0]).exponential_(generator=generator)
                                   for generator in self.generators])
        return scores - exponential.clamp_min(torch.finfo(scores.dtype).tiny).log()


class _MakeWay:
    """Called once per decoding step (as a logits processor, scores unchanged): lets a waiting timing have the GPU."""

    def __init__(self, gate: DeviceGate, sync: Callable[[], None]) -> None:
        self.gate, self.sync = gate, sync

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.gate.make_way(self.sync)
        return scores


@dataclass
class ChatRequest:
    messages: list[dict[str, str]]
    params: SamplingParams
    seed: int | None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    def sampling_key(self) -> tuple[float, float, int]:
        """What must be equal for two requests to share a batch (a greedy request's top_p does not matter)."""
        p = self.params
        return max(p.temperature, 0.0), p.top_p if p.temperature > 0 else 1.0, p.max_tokens


class CompletionBatcher:
    """Concurrent trajectories' requests to a local model, answered in batches. Answered one at a time they would
    leave the accelerator mostly idle (a decoding step of a small model costs about the same for 1 row as for 32), so
    requests are queued and one worker thread (a model is not safe to drive from several threads) takes up to
    `max_batch` of them, waiting at most `batch_wait_s` for more, and hands each group that shares its sampling
    settings to `answer`, which returns a Completion per request, in order; the event loop keeps feeding the
    evaluator meanwhile. What `answer` raises becomes each waiting request's GenerationError (its trajectory
    records the cause as its turn's error)."""

    def __init__(self, answer: Callable[[list[ChatRequest]], list[Completion]], max_batch: int = 32,
                 batch_wait_s: float = 0.005, name: str = "generate") -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self.answer, self.max_batch, self.batch_wait_s = answer, max_batch, batch_wait_s
        self._queue: queue.Queue[ChatRequest | None] = queue.Queue()
        self._closed = False
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    async def complete(self, messages: list[dict[str, str]], params: SamplingParams,
                       seed: int | None = None) -> Completion:
        if self._closed:
            raise GenerationError("the local model was closed")
        request = ChatRequest(messages, params, seed)
        self._queue.put(request)
        return await asyncio.wrap_future(request.future)

    def close(self) -> None:
        """Answer what was taken, then stop the thread."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)

    def _serve(self) -> None:
        while (first := self._queue.get()) is not None:
            pending = [first]
            deadline = time.monotonic() + self.batch_wait_s
            while len(pending) < self.max_batch:
                try:
                    request = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if request is None:  # closing: answer what was taken, then stop
                    self._queue.put(None)
                    break
                pending.append(request)
            groups: dict[tuple[float, float, int], list[ChatRequest]] = {}
            for request in pending:
                if request.future.set_running_or_notify_cancel():
                    groups.setdefault(request.sampling_key(), []).append(request)
            for group in groups.values():
                self._answer(group)

    def _answer(self, batch: list[ChatRequest]) -> None:
        try:
            completions = self.answer(batch)
        except Exception as exc:  # noqa: BLE001 - see the class
            error = GenerationError(f"local generation failed: {type(exc).__name__}: {exc}")
            for request in batch:
                request.future.set_exception(error)
            return
        for request, completion in zip(batch, completions):
            request.future.set_result(completion)


class HFChatModel:
    """A local transformers model (`--model hf:PATH`: a saved folder or a GGUF, see drkernel.agent.local_models), for
    small models, tests and the miniature reproduction.

    Requests are answered in batches (`CompletionBatcher`), each with ONE left-padded `generate` call. The chat
    template is the tokenizer's. Sampling is temperature then top_p (no top_k), drawn by `_RowSampler` from each
    row's own random stream, seeded with the request's seed (a random one when it has none): a seeded request samples
    the same tokens whatever else shares its batch, so a rerun repeats it. A greedy request ignores its seed.

    With a device `gate` (that of the GPU the evaluations run on), generation holds it shared and makes way between
    decoding steps: it runs beside correctness checks, never while a candidate is timed.

    `static_cache`: generate over a static KV cache (`static_cache_settings`), which transformers compiles on a GPU.
    It compiles one decoding step per shape and falls back to eager decoding after a few, and a bench's batches
    hold 1 to `max_batch` rows (batches of changing size made a static-cache bench slower on an H100), so every batch is
    filled up to `max_batch` rows with copies of its first request (its seed too: they end when it ends), whose
    answers are dropped; a decoding step of a small model costs about the same for 1 row as for 32.
    """

    def __init__(
        self, path: str, device: str = "cpu", max_batch: int = 32, batch_wait_s: float = 0.005,
        gate: DeviceGate | None = None, static_cache: bool = False,
    ) -> None:
        try:
            locate(path)
        except ValueError as exc:
            raise UsageError(f"hf:{exc}") from exc
        require("transformers", "train", "running a local Hugging Face model")
        try:
            self.tokenizer = load_tokenizer(path, padding_side="left")
            model = load_causal_lm(path)
        except (OSError, ValueError) as exc:  # files transformers cannot read
            raise UsageError(f"hf:{path} does not load: {exc}") from exc
        if self.tokenizer.chat_template is None:
            raise UsageError(f"the tokenizer at {path} has no chat template")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = model.to(device).eval()
        self.device = device
        self.gate = gate
        self.static_cache = static_cache
        self.max_batch = max_batch
        self.batcher = CompletionBatcher(self._generate, max_batch, batch_wait_s, name="hf-generate")

    async def complete(
        self, messages: list[dict[str, str]], params: SamplingParams, seed: int | None = None, tag: str = ""
    ) -> Completion:
        return await self.batcher.complete(messages, params, seed)

    def _generate(self, batch: list[ChatRequest]) -> list[Completion]:
        import torch
        from transformers import TemperatureLogitsWarper, TopPLogitsWarper

        params = batch[0].params
        seeds = [random.getrandbits(63) if request.seed is None else request.seed for request in batch]
        rows = batch
        if self.static_cache:  # one batch size for the compiled step: the first request again, its seed, dropped
            filler = self.max_batch - len(batch)
            rows, seeds = rows + [batch[0]] * filler, seeds + [seeds[0]] * filler
        inputs = self.tokenizer.apply_chat_template(
            [request.messages for request in rows], add_generation_prompt=True, padding=True, return_tensors="pt",
            return_dict=True,
        ).to(self.device)
        processors = []
        if params.temperature > 0:
            processors = [TemperatureLogitsWarper(params.temperature), TopPLogitsWarper(params.top_p),
                          _RowSampler(seeds, self.device)]
        if self.gate is not None:
            sync = torch.cuda.synchronize if self.device.startswith("cuda") else (lambda: None)
            processors.insert(0, _MakeWay(self.gate, sync))
        cache = static_cache_settings(inputs["input_ids"].shape[1] + params.max_tokens) if self.static_cache else {}
        with torch.no_grad(), self.gate.shared() if self.gate is not None else contextlib.nullcontext():
            output = self.model.generate(
                inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=params.max_tokens,
                do_sample=False, logits_processor=processors, pad_token_id=self.tokenizer.pad_token_id, **cache,
            )
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [self.tokenizer.eos_token_id if eos is None else eos])
        completions = []
        for request, row, mask in zip(batch, output[:, inputs["input_ids"].shape[1]:].tolist(),
                                      inputs["attention_mask"]):
            # a row that ended early is padded up to the longest one: it ends at its own first EOS
            length = next((i + 1 for i, token in enumerate(row) if token in eos), len(row))
            text = self.tokenizer.decode(row[:length], skip_special_tokens=True)
            for stop in request.params.stop:
                text = text.split(stop, 1)[0]
            completions.append(Completion(
                text, {"prompt_tokens": int(mask.sum()), "completion_tokens": length},
                "length" if length >= params.max_tokens else "stop",
            ))
        return completions

    async def close(self) -> None:
        self.batcher.close()
