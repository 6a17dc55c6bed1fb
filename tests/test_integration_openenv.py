"""drkernel as an OpenEnv environment, through openenv-core's own server, client, validators and discovery: an
episode gets the verdicts, rewards and next prompts that `drkernel bench`'s loop gives the same answers; the
environment folder passes `openenv validate`; the default app passes openenv-core's runtime validation; the image's
Dockerfile names what exists."""

from __future__ import annotations

import asyncio
import json
import shlex
import tomllib
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
    CLIENT_TIMEOUT_S, ENV_NAME, OPENENV_PATH, EpisodeConfig, EpisodeError, KernelAction, KernelEnvClient,
    KernelEnvironment, KernelObservation, create_server, create_service)
from drkernel.integrations.openenv_app import AppSettings, build_app, parse_settings  # noqa: E402
from drkernel.scheduling.scheduler import Scheduler  # noqa: E402
from drkernel.schema import EvalOptions  # noqa: E402
from drkernel.service.dispatcher import Dispatcher  # noqa: E402
from drkernel.service.store import Store  # noqa: E402
from tests.test_service_api import AUTH, TOKEN, ScriptedBackend, serving_app as serving  # noqa: E402
from drkernel.tasks import load_task_dir  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ENV_FOLDER = REPO / "envs" / ENV_NAME
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


# --- publishing: the environment folder, the default app, the image --------------------------------------------

def test_the_environment_folder_passes_openenvs_validation():
    """`openenv validate envs/drkernel_env --json`, openenv-core's own command: manifest, package, lock file,
    `server` script, server/app.py with main(), and every deployment mode."""
    from openenv.cli.__main__ import app as openenv_cli
    from typer.testing import CliRunner

    result = CliRunner().invoke(openenv_cli, ["validate", str(ENV_FOLDER), "--json", "--verbose"])
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["passed"] and report["issues"] == [], result.stdout
    assert all(report["deployment_modes"].values()) and report["environment"] == "drkernel"


def test_openenvs_discovery_finds_the_client_the_manifest_names(monkeypatch):
    """AutoEnv's discovery of an installed `openenv-<module>` distribution: the manifest read from the package, the
    client `<module>.client.DrkernelEnv` and the classes the manifest names."""
    from openenv.auto._discovery import _create_env_info_from_package

    project = tomllib.loads((ENV_FOLDER / "pyproject.toml").read_text())["project"]
    module = project["name"].removeprefix("openenv-").replace("-", "_")
    assert module == ENV_NAME
    monkeypatch.syspath_prepend(str(ENV_FOLDER.parent))  # as installed: the package is the folder
    info = _create_env_info_from_package(project["name"], module, project["version"])
    assert info.env_key == "drkernel" and info.manifest["app"] == "server.app:app"
    assert info.get_client_class() is KernelEnvClient
    assert (info.get_action_class(), info.get_observation_class()) == (KernelAction, KernelObservation)


@pytest.mark.slow
def test_the_default_app_passes_openenvs_runtime_validation(monkeypatch):
    """The app `drkernel-openenv` serves, with its default tasks (the synthetic family and the examples), through
    openenv-core's runtime validator; episode errors are 409s with their message; metadata names the environment
    and its docs; an episode runs over openenv-core's client."""
    from openenv.cli._validation import validate_running_environment

    monkeypatch.chdir(REPO)  # where examples/tasks is, as in the image's /app
    settings = parse_settings(["--synthetic", "4", "--shape-scale", str(1 / 256), "--device", "cpu",
                               "--workers", "1", "--eval-timeout-s", "120"], environ={})
    app = build_app(settings)
    with serving(app) as url:
        report = validate_running_environment(url)
        assert report["passed"] and report["summary"]["passed_count"] == report["summary"]["total_count"], report
        metadata = httpx.get(url + "/metadata").json()
        assert metadata["name"] == ENV_NAME and metadata["documentation_url"] == "docs/integrations.md"
        assert "9 tasks" in metadata["description"] and metadata["readme_content"]
        refused = httpx.post(url + "/step", json={"action": {"answer": "no episode"}})
        assert refused.status_code == 409 and "reset first" in refused.json()["detail"]
        unknown = httpx.post(url + "/reset", json={"task": "nope"})
        assert unknown.status_code == 409 and "unknown task 'nope'" in unknown.json()["detail"]
        with KernelEnvClient(base_url=url).sync() as env:
            first = env.reset(task="2_relu").observation
            assert first.task == "2_relu" and not first.done
            judged = env.step(KernelAction(answer=ANSWERS[0]))
        assert judged.observation.status == "correct" and judged.reward > 0


def test_settings_come_from_flags_over_variables_and_timeouts_fit_an_evaluation():
    environ = {"DRKERNEL_ENV_TURNS": "2", "DRKERNEL_ENV_TASKS": "a,b", "DRKERNEL_ENV_SYNTHETIC": "0"}
    settings = parse_settings(["--turns", "4", "--tasks", "c"], environ=environ)
    assert (settings.turns, settings.tasks, settings.synthetic) == (4, ("a", "b", "c"), 0)
    assert AppSettings.from_environment(environ).turns == 2
    with pytest.raises(ValueError, match="DRKERNEL_ENV_TURNS='x'"):
        AppSettings.from_environment({"DRKERNEL_ENV_TURNS": "x"})
    with pytest.raises(ValueError, match="no tasks"):
        AppSettings(synthetic=0, examples=False).task_set()
    # a client waits for an evaluation at its limit behind a few queued ones, not openenv-core's 60 s
    assert KernelEnvClient(base_url="http://127.0.0.1:1")._message_timeout >= 4 * EvalOptions().timeout_s
    assert CLIENT_TIMEOUT_S >= 4 * settings.eval_timeout_s


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    joined = dockerfile.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_the_images_dockerfile_builds_from_what_the_repository_holds():
    """Not built here (no image registry): it parses, its base is a CUDA image, every COPY source exists from the
    repository's root (its documented context), the extras it installs exist, and its entrypoint is the console
    script with flags the script accepts."""
    dockerfile = ENV_FOLDER / "server" / "Dockerfile"
    instructions = _instructions(dockerfile)
    assert f"docker build -f {dockerfile.relative_to(REPO)} " in dockerfile.read_text()
    assert instructions[0][0] == "FROM" and instructions[0][1].startswith("nvidia/cuda:")
    assert {kind for kind, _ in instructions} <= {"FROM", "RUN", "ENV", "WORKDIR", "COPY", "EXPOSE", "HEALTHCHECK",
                                                   "ENTRYPOINT", "CMD"}
    for kind, args in instructions:
        if kind == "COPY":
            *sources, _ = shlex.split(args)
            assert sources and all((REPO / source).exists() for source in sources), args
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    installs = " ".join(args for kind, args in instructions if kind == "RUN" and "pip install" in args)
    extras = installs.split("./[", 1)[1].split("]", 1)[0].split(",")
    assert set(extras) <= set(pyproject["optional-dependencies"])
    (entrypoint,) = [json.loads(args) for kind, args in instructions if kind == "ENTRYPOINT"]
    (command,) = [json.loads(args) for kind, args in instructions if kind == "CMD"]
    assert entrypoint == ["drkernel-openenv"]
    assert pyproject["scripts"]["drkernel-openenv"] == "drkernel.integrations.openenv_app:main"
    assert parse_settings(command, environ={}).host == "0.0.0.0"
