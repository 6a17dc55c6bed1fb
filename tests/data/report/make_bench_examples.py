"""Records tests/data/report/bench_examples/: a real `drkernel bench` run (the agent loop, the embedded scheduler,
the CPU interpreter) over examples/tasks, 2 samples x 3 turns, the model replaced by the agent's scripted chat
server answering with the example candidates (formats errors, compile errors, wrong, hacked, correct).

    PYTHONPATH=. python tests/data/report/make_bench_examples.py      (about a minute on 2 CPU cores)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from drkernel.agent.replay import ChatScript, ScriptedChatServer, fenced

REPO = Path(__file__).resolve().parents[3]
OUT = Path(__file__).resolve().parent / "bench_examples"
NO_CODE = "I would first profile the reference before writing any kernel."


def answer(name: str) -> str:
    return fenced((REPO / "examples" / "candidates" / f"{name}.py").read_text())


SCRIPT = ChatScript(samples={
    "1_vector_add": {0: [answer("1_vector_add__no_modelnew"), answer("1_vector_add__triton_compile_error"),
                         answer("1_vector_add__triton")],
                     1: [answer("1_vector_add__wrong_offset"), answer("1_vector_add__triton")]},
    "2_relu": {0: [NO_CODE, answer("2_relu__pytorch_only"), answer("2_relu__triton")],
               1: [answer("2_relu__syntax_error"), answer("2_relu__wrong"), answer("2_relu__triton")]},
    "3_softmax_rows": {0: [answer("3_softmax_rows__no_normalise"), answer("3_softmax_rows__triton")],
                       1: [answer("3_softmax_rows__triton")]},
    "4_matmul_small": {0: [answer("4_matmul_small__triton")], 1: [NO_CODE, answer("4_matmul_small__triton")]},
    "5_layernorm": {0: [answer("5_layernorm__raises"), answer("5_layernorm__triton")],
                    1: [answer("5_layernorm__raises")]},
})

if __name__ == "__main__":
    shutil.rmtree(OUT, ignore_errors=True)
    with ScriptedChatServer(SCRIPT) as server:
        subprocess.run(
            [sys.executable, "-m", "drkernel.cli.main", "bench", "--tasks", str(REPO / "examples" / "tasks"),
             "--model", "scripted", "--base-url", server.url, "--device", "cpu", "--samples", "2", "--turns", "3",
             "--perf-trials", "3", "--timeout", "120", "--out", str(OUT)],
            check=True, cwd=OUT.parent,  # not the repository root, so PYTHONPATH decides which drkernel runs
        )
