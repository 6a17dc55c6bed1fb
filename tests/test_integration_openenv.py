"""drkernel as an OpenEnv environment, through openenv-core's own server and client: an episode gets the verdicts,
rewards and next prompts that `drkernel bench`'s loop gives the same answers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("openenv")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from drkernel.agent.backends import Completion  # noqa: E402
from drkernel.scheduling.evaluator import BackendEvaluator  # noqa: E402
from drkernel.agent.loop import LoopConfig, run_loop  # noqa: E402
from drkernel.agent.replay import fenced  # noqa: E402
from drkernel.agent.parsing import extract_code  # noqa: E402
from drkernel.integrations.openenv import (  # noqa: E402
    OPENENV_PATH, EpisodeConfig, EpisodeError, KernelAction, KernelEnvClient, KernelEnvironment, create_server,
    create_service)
from drkernel.scheduling.scheduler import Scheduler  # noqa: E402
from drkernel.schema import EvalOptions  # noqa: E402
from drkernel.service.dispatcher import Dispatcher  # noqa: E402
from drkernel.service.store import Store  # noqa: E402
from tests.test_service_api import AUTH, TOKEN, ScriptedBackend, serving_app as serving  # noqa: E402
from drkernel.tasks import load_task_dir  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CANDIDATES = REPO / "examples" / "candidates"
OPTIONS = EvalOptions(device="cpu", measure_performance=False, correctness_trials=1, timeout_s=120)
ANSWERS = [  # correct, hacked (no Triton kernel), no code at all
    fenced((CANDIDATES / "2_relu__triton.py").read_text()),
    fenced((CANDIDATES / "2_relu__pytorch_only.py").read_text()),
    "I would rather not write code today.",
]


class Answers:
    """A chat model that gives the scripted answers in turn (what `drkernel bench` would get from a server)."""

    async def complete(self, messages, params, seed=None, tag=""):
        turn = int(tag.rsplit("/", 1)[1])
        return Completion(ANSWERS[turn - 1], {"prompt_tokens": 0, "completion_tokens": 0})

    async def close(self) -> None:
        pass


@pytest.mark.slow
def test_an_openenv_episode_matches_bench_on_the_same_answers(tmp_path: Path) -> None:
    tasks = [t for t in load_task_dir(REPO / "examples" / "tasks") if t.key == "2_relu"]
    scheduler = Scheduler(device="cpu", workers=1, cache_entries=0)
    evaluator = BackendEvaluator(scheduler, OPTIONS)
    try:
        with serving(create_server(tasks, evaluator, EpisodeConfig(turns=3))) as url, \
                KernelEnvClient(base_url=url, message_timeout_s=300).sync() as env:
            first = env.reset(task="2_relu").observation
            assert first.task == "2_relu" and first.turn == 0 and not first.done
            assert [m["role"] for m in first.messages] == ["user"] and "class Model" in first.messages[0]["content"]
            steps = [env.step(KernelAction(answer=answer)) for answer in ANSWERS]

        outcome = asyncio.run(run_loop(tasks, Answers(), evaluator, LoopConfig(turns=3), tmp_path / "bench"))
        bench = sorted(outcome.records, key=lambda r: r.turn)
        assert [s.observation.status for s in steps] == [r.status for r in bench] == [
            "correct", "hacked", "format_error"]
        assert [s.reward for s in steps] == [r.reward for r in bench] and steps[0].reward > 0
        assert [s.observation.feedback for s in steps] == [r.feedback for r in bench]
        assert steps[0].observation.result["status"] == "correct" and steps[2].observation.result is None
        assert [s.done for s in steps] == [False, False, True]
        # The chat shown after turn t is the one bench asks turn t+1 with (the full context policy here).
        assert steps[0].observation.messages == bench[1].messages
        assert steps[1].observation.messages == bench[2].messages
    finally:
        scheduler.close()


def test_the_environment_on_the_service_stores_every_judged_answer(tmp_path: Path) -> None:
    tasks = [t for t in load_task_dir(REPO / "examples" / "tasks") if t.key == "2_relu"]
    backend = ScriptedBackend()  # judges a candidate "verdict <status>" as it asks
    dispatcher = Dispatcher(Store(tmp_path / "store.db"), backend, backend.device)
    app = create_service(dispatcher, tasks, EpisodeConfig(turns=3), EvalOptions(device="cpu"))
    correct = fenced("verdict correct\nclass ModelNew: pass")
    with serving(app) as url:
        with KernelEnvClient(base_url=url + OPENENV_PATH, message_timeout_s=60).sync() as env:
            env.reset(task="2_relu")
            steps = [env.step(KernelAction(answer=answer)) for answer in (correct, ANSWERS[2], correct)]
        assert [s.observation.status for s in steps] == ["correct", "format_error", "correct"]
        assert [s.reward for s in steps] == [0.5, 0.0, 0.5]
        assert httpx.get(url + "/v1/health").status_code == 200  # the service's own API on the same server
    # both answers with code are in the durable store; the second, identical, got the stored verdict
    assert Store(tmp_path / "store.db").counts() == {"queued": 0, "running": 0, "done": 2}
    assert [(r.candidate, r.task_name) for r in backend.submitted] == [(extract_code(correct), "2_relu")]


def test_the_service_token_guards_the_environment(tmp_path: Path) -> None:
    tasks = [t for t in load_task_dir(REPO / "examples" / "tasks") if t.key == "2_relu"]
    backend = ScriptedBackend()
    app = create_service(Dispatcher(Store(tmp_path / "store.db"), backend, backend.device), tasks, token=TOKEN)
    with serving(app) as url:
        assert httpx.get(url + OPENENV_PATH + "/health").status_code == 401
        assert httpx.get(url + OPENENV_PATH + "/health", headers=AUTH).status_code == 200
        with pytest.raises(ConnectionError):  # openenv-core's client sends no token
            with KernelEnvClient(base_url=url + OPENENV_PATH).sync() as env:
                env.reset(task="2_relu")
    with pytest.raises(ValueError, match="evaluates on cpu"):
        create_service(Dispatcher(Store(tmp_path / "other.db"), backend, backend.device), tasks,
                       options=EvalOptions(device="cuda"))


def test_an_episode_refuses_unknown_tasks_and_steps_out_of_turn() -> None:
    tasks = [t for t in load_task_dir(REPO / "examples" / "tasks") if t.key in ("2_relu", "3_softmax_rows")]

    class NoEvaluator:
        async def evaluate(self, task, code):
            raise AssertionError("nothing may be judged here")

    env = KernelEnvironment(tasks, NoEvaluator(), EpisodeConfig(turns=1))
    with pytest.raises(EpisodeError, match="reset first"):
        env.step(KernelAction(answer="no episode yet"))
    with pytest.raises(EpisodeError, match="unknown task 'nope'"):
        env.reset(task="nope")
    drawn = {env.reset(seed=seed).task for seed in range(8)}
    assert drawn == {"2_relu", "3_softmax_rows"}  # a seed draws from the task set
    assert env.reset(seed=3).task == env.reset(seed=3).task
    observation = env.step(KernelAction(answer="no code block"))  # a format error is judged without the evaluator
    assert observation.status == "format_error" and observation.reward == 0.0 and observation.done
    with pytest.raises(EpisodeError, match="after its last turn"):
        env.step(KernelAction(answer="one too many"))
    with pytest.raises(ValueError, match="at least one turn"):
        EpisodeConfig(turns=0)
