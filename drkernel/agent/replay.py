"""A scripted OpenAI-compatible chat server (standard library only, 127.0.0.1 only) for tests and benchmarks.

It answers `POST /v1/chat/completions` from a script: for each task, a list of answers by turn (the last one
repeats), the same for every sample or one list per sample. An answer may first fail a number of times with an HTTP
status (429 with Retry-After, 500, ...) or wait before answering, to exercise retries and timeouts. The client's
`X-Drkernel-Request: task/sample/turn` header says which answer is due; real servers ignore that header.
`replay_candidates` scripts turn 1 of every task from a folder of candidate files, which measures the loop's
throughput with the model taken out of the picture.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Union

from drkernel.agent.backends import REQUEST_TAG_HEADER
from drkernel.tasks import Task, TaskSelectionError, load_candidates, pair_candidates


@dataclass
class Reply:
    """One scripted answer: `fail_times` failures with `fail_status` first, then `content` after `delay_s`."""

    content: str = ""
    fail_status: int = 500
    fail_times: int = 0
    retry_after: float | None = None
    delay_s: float = 0.0


ReplySpec = Union[str, Mapping[str, Any], Reply]
TurnReplies = Sequence[ReplySpec]


@dataclass
class ChatScript:
    """Answers by task (its key or its name) and turn; `samples` overrides the answers of chosen samples."""

    replies: dict[str, TurnReplies] = field(default_factory=dict)
    samples: dict[str, dict[int, TurnReplies]] = field(default_factory=dict)

    def reply(self, task: str, sample: int, turn: int) -> Reply:
        for name in (task, task.rsplit("/", 1)[-1]):
            turns = self.samples.get(name, {}).get(sample) or self.replies.get(name)
            if turns:
                spec = turns[min(turn, len(turns)) - 1]
                return spec if isinstance(spec, Reply) else Reply(spec) if isinstance(spec, str) else Reply(**spec)
        raise KeyError(f"the script has no answer for task {task!r}")

    @classmethod
    def from_file(cls, path: str | Path) -> ChatScript:
        """JSON: {"replies": {task: [answer, ...]}, "samples": {task: {"0": [answer, ...]}}}; an answer is a string
        or an object with Reply's fields."""
        data = json.loads(Path(path).read_text())
        samples = {task: {int(s): turns for s, turns in by_sample.items()}
                   for task, by_sample in data.get("samples", {}).items()}
        return cls(data.get("replies", {}), samples)


def fenced(code: str) -> str:
    """An answer as a model writes one: a sentence, then the code in a python block."""
    return f"Here is the optimized model.\n\n```python\n{code.rstrip()}\n```\n"


def replay_candidates(tasks: Sequence[Task], candidates: str | Path) -> ChatScript:
    """Every task answered at every turn with its candidate (the first one, when a task has several); candidates
    that answer none of `tasks` are left out, so a folder of candidates can serve a subset of its tasks."""
    replies: dict[str, TurnReplies] = {}
    for candidate in load_candidates(candidates):
        try:
            [(task, _)] = pair_candidates(tasks, [candidate])
        except TaskSelectionError:
            continue
        replies.setdefault(task.key, [fenced(candidate.code)])
    return ChatScript(replies)


class ScriptedChatServer:
    """The server, in a background thread; `url` is the base URL a client takes (ending in /v1).

    `api_key` makes it answer 401 to any other key, `model` 404 to any other model name. `requests` lists the
    (tag, messages) of every request it answered from the script, in arrival order, and `bodies` their whole JSON
    bodies (sampling settings included), in the same order, for tests to inspect.
    """

    def __init__(self, script: ChatScript, port: int = 0, api_key: str | None = None,
                 model: str | None = None) -> None:
        self.script, self.api_key, self.model = script, api_key, model
        self.requests: list[tuple[str, list[dict[str, str]]]] = []
        self.bodies: list[dict[str, Any]] = []
        self._attempts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True, name="scripted-chat")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> ScriptedChatServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> ScriptedChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def answer(self, headers: Mapping[str, str], body: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
        """(status, extra headers, JSON body) for one request."""
        if self.api_key is not None and headers.get("Authorization") != f"Bearer {self.api_key}":
            return 401, {}, _error("invalid API key", "authentication_error")
        if self.model is not None and body.get("model") != self.model:
            return 404, {}, _error(f"the model {body.get('model')!r} does not exist", "not_found_error")
        tag, messages = headers.get(REQUEST_TAG_HEADER, ""), body.get("messages") or []
        try:
            task, sample, turn = tag.rsplit("/", 2)
            reply = self.script.reply(task, int(sample), int(turn))
        except (ValueError, KeyError) as exc:
            return 400, {}, _error(f"no scripted answer for {REQUEST_TAG_HEADER} {tag!r}: {exc}", "invalid_request")
        with self._lock:
            self.requests.append((tag, messages))
            self.bodies.append(body)
            attempt = self._attempts[tag] = self._attempts.get(tag, 0) + 1
        if attempt <= reply.fail_times:
            extra = {"Retry-After": f"{reply.retry_after:g}"} if reply.retry_after is not None else {}
            return reply.fail_status, extra, _error(f"scripted failure {attempt} of {reply.fail_times}", "server_error")
        time.sleep(reply.delay_s)
        prompt_tokens = sum(len(m.get("content", "").split()) for m in messages)
        return 200, {}, {
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": reply.content}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(reply.content.split()),
                      "total_tokens": prompt_tokens + len(reply.content.split())},
        }


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


def _handler(server: ScriptedChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (the http.server API)
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                status, extra, payload = 400, {}, _error("the body is not JSON", "invalid_request")
            else:
                if self.path.rstrip("/") != "/v1/chat/completions":
                    status, extra, payload = 404, {}, _error(f"no route {self.path}", "not_found_error")
                else:
                    status, extra, payload = server.answer(self.headers, body)
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **extra}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout): nothing to answer

        def log_message(self, format: str, *args: Any) -> None:
            return None  # quiet: tests and benchmarks read `requests` instead

    return Handler


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m drkernel.agent.replay`: serve a script file, or a folder of candidates, until Ctrl-C."""
    import argparse
    import sys

    from drkernel.tasks import TaskLoadError, load_tasks

    parser = argparse.ArgumentParser(prog="python -m drkernel.agent.replay", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--script", type=Path, help="a JSON script (ChatScript.from_file's format)")
    source.add_argument("--candidates", help="a folder or .jsonl of candidates, each the answer to its task")
    parser.add_argument("--tasks", help="the tasks the candidates answer (needed with --candidates)")
    parser.add_argument("--port", type=int, default=8001, help="port on 127.0.0.1 (default: 8001; 0 picks a free one)")
    parser.add_argument("--api-key", help="answer 401 to any other key (default: accept any)")
    parser.add_argument("--model", help="answer 404 to any other model name (default: accept any)")
    args = parser.parse_args(argv)
    try:
        if args.script is not None:
            script = ChatScript.from_file(args.script)
        elif args.tasks:
            script = replay_candidates(load_tasks(args.tasks), args.candidates)
        else:
            parser.error("--candidates needs --tasks")
        server = ScriptedChatServer(script, port=args.port, api_key=args.api_key, model=args.model)
    except (OSError, ValueError, TaskLoadError) as exc:  # a missing file, bad JSON, a port in use: usage errors
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"scripted OpenAI-compatible server at {server.url} (Ctrl-C stops it)", file=sys.stderr, flush=True)
    with server:
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
