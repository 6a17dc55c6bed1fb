"""`drkernel bench` against a real OpenAI-compatible server that nobody here wrote: `transformers serve` (transformers
5.x; needs fastapi, uvicorn, pydantic and openai) serving a tiny model made in the test, offline, on the CPU."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drkernel.agent.backends import HFChatModel, SamplingParams
from drkernel.agent.records import read_trajectories
from drkernel.cli.main import app
from tests.test_agent_hf import tiny_model
from tests.test_service_api import free_port

REPO = Path(__file__).resolve().parents[1]
SERVE = "from transformers.cli.transformers import main; main()"


@pytest.mark.slow
def test_bench_against_transformers_serve(tmp_path):
    for module in ("fastapi", "uvicorn", "pydantic", "openai"):
        pytest.importorskip(module)
    httpx = pytest.importorskip("httpx")
    model = tmp_path / "model"
    tiny_model(model)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE, "serve", str(model), "--device", "cpu", "--host", "127.0.0.1",
         "--port", str(port)],
        env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stdout.read()
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "transformers serve did not answer /health within 120 s"
            time.sleep(0.5)
        assert [m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]] == [str(model)]
        result = CliRunner().invoke(app, [
            "bench", "--tasks", str(REPO / "examples" / "tasks"), "--name", "2_relu", "--model", str(model),
            "--base-url", f"{base}/v1", "--turns", "2", "--max-tokens", "12", "--temperature", "0",
            "--device", "cpu", "--trials", "1", "--no-perf", "--out", str(tmp_path / "run"),
        ])
        assert result.exit_code == 0, result.output
    finally:
        server.terminate()
        server.wait(timeout=30)
    records = sorted(read_trajectories(tmp_path / "run"), key=lambda r: r.turn)
    assert [(r.task, r.turn) for r in records] == [("2_relu", 1), ("2_relu", 2)]
    # the server's greedy answers are the tiny model's own: the same text and token counts from it in-process
    local = HFChatModel(str(model))
    for record in records:
        mine = asyncio.run(local.complete(record.messages, SamplingParams(max_tokens=12, temperature=0.0)))
        assert record.response == mine.text
        assert record.usage == {"prompt_tokens": mine.usage["prompt_tokens"], "completion_tokens": 12}
    asyncio.run(local.close())
