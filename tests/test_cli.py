"""The command line's contract: exit codes by error kind, and the commands' modules kept apart."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drkernel.cli import batch
from drkernel.cli.main import app
from drkernel.errors import DrkernelError, EngineError, UsageError

CLI = Path(__file__).resolve().parent.parent / "drkernel" / "cli"


def _eval_batch_raising(monkeypatch, exc: BaseException):
    def run_batch(*args, **kwargs):
        raise exc

    monkeypatch.setattr(batch, "run_batch", run_batch)
    return CliRunner().invoke(app, ["eval", "--tasks", "t", "--candidates", "c"])


def test_usage_errors_exit_2_engine_errors_1_with_their_message(monkeypatch):
    result = _eval_batch_raising(monkeypatch, UsageError("no such thing [here]"))
    assert result.exit_code == 2 and "error: no such thing [here]" in result.output
    result = _eval_batch_raising(monkeypatch, EngineError("cannot reach the Ray cluster"))
    assert result.exit_code == 1 and "error: cannot reach the Ray cluster" in result.output


@pytest.mark.parametrize("bug", [ValueError("a bug"), TypeError("a bug"), OSError("a bug"), KeyError("a bug")])
def test_a_bug_is_a_bug_not_bad_arguments(monkeypatch, bug):
    """Before, the CLI caught ValueError/TypeError/OSError broadly, so a bug in drkernel exited 2 as 'bad arguments'."""
    result = _eval_batch_raising(monkeypatch, bug)
    assert result.exit_code == 1 and result.exception is bug  # the traceback is shown, not an error line
    assert "error:" not in result.output


def test_every_error_drkernel_defines_derives_from_one_base():
    from drkernel.agent.backends import FatalGenerationError
    from drkernel.agent.bench import RunDirError
    from drkernel.report.published import PublishedError
    from drkernel.report.runs import RunReadError
    from drkernel.runner.forkserver import ForkServerDied
    from drkernel.service.client import ServiceError
    from drkernel.tasks import TaskLoadError
    from drkernel.tasks.synthetic import SyntheticError
    from drkernel.train.config import ConfigError
    from drkernel.train.rollout import EvaluatorUnavailable, TemplateMismatch

    for usage in (RunDirError, PublishedError, RunReadError, TaskLoadError, SyntheticError, ConfigError,
                  TemplateMismatch):
        assert issubclass(usage, UsageError) and issubclass(usage, ValueError)
    for engine in (ForkServerDied, ServiceError, EvaluatorUnavailable):
        assert issubclass(engine, EngineError) and issubclass(engine, RuntimeError)
    assert issubclass(FatalGenerationError, DrkernelError)
def _cli_imports(path: Path) -> set[str]:
    """The drkernel.cli modules a file imports, in functions too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("drkernel.cli"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("drkernel.cli"))
    return found


def test_commands_share_only_the_common_module():
    """Only main imports the commands; a command imports drkernel.cli.common (and eval its batch part), never main
    or another command."""
    shared = {"drkernel.cli.common", "drkernel.cli.options"}
    for path in CLI.glob("*.py"):
        if path.stem in ("main", "__init__"):
            continue
        allowed = shared | ({"drkernel.cli.batch"} if path.stem == "eval" else set())
        assert _cli_imports(path) <= allowed, path.name


# --- one engine, named one way ---------------------------------------------------------------------------------


def test_one_parser_names_every_engine():
    from drkernel.scheduling.engine import EngineConfig, legacy_engine_name

    assert EngineConfig().kind == "embedded"
    for name, kind, address in (("ray:auto", "ray", "auto"), ("ray:10.0.0.1:6379", "ray", "10.0.0.1:6379"),
                                ("ray://head:10001", "ray", "ray://head:10001"),
                                ("http://evalhost:8000", "service", None), ("https://e.example", "service", None)):
        engine = EngineConfig(name)
        assert engine.kind == kind and (address is None or engine.ray_address == address)
    for bad in ("ray", "ray:", "http://", "localhost:8000", "Embedded"):
        with pytest.raises(UsageError, match="the engine must be embedded, ray:auto"):
            EngineConfig(bad)
    # the older spellings: --ray ADDRESS, --service URL (and a bench config.json's ray / service keys)
    assert legacy_engine_name(ray="auto") == "ray:auto" and legacy_engine_name(ray="ray://h:1") == "ray://h:1"
    assert legacy_engine_name(service="http://h:1") == "http://h:1" and legacy_engine_name() is None
    with pytest.raises(UsageError):
        EngineConfig(workers=0)
    # judges that outlive their evaluations: the default; turned off for the embedded engine only
    assert EngineConfig().judge_hosts and not EngineConfig(judge_hosts=False).judge_hosts
    for elsewhere in ("ray:auto", "http://evalhost:8000"):
        assert EngineConfig(elsewhere).judge_hosts
        with pytest.raises(UsageError, match="turning judge hosts off applies to the embedded engine only"):
            EngineConfig(elsewhere, judge_hosts=False)


def _seen_by_run_batch(monkeypatch, *args: str):
    seen = {}
    monkeypatch.setattr(batch, "run_batch", lambda tasks, cands, options, levels, names, out, engine: seen.update(
        options=options, engine=engine))
    result = CliRunner().invoke(app, ["eval", "--tasks", "t", "--candidates", "c", *args])
    return result, seen


def test_eval_names_its_engine_as_bench_serve_and_train_do(monkeypatch):
    from drkernel.scheduling.engine import EngineConfig

    result, seen = _seen_by_run_batch(monkeypatch, "--engine", "ray://head:10001", "--workers", "3")
    assert result.exit_code == 0, result.output
    assert seen["engine"] == EngineConfig("ray://head:10001", workers=3)
    result, seen = _seen_by_run_batch(monkeypatch, "--ray", "auto")  # the older spelling, through the same parser
    assert result.exit_code == 0 and seen["engine"].name == "ray:auto"
    result, _ = _seen_by_run_batch(monkeypatch, "--ray", "auto", "--engine", "embedded")
    assert result.exit_code == 2 and "name the engine once" in result.output
    result, _ = _seen_by_run_batch(monkeypatch, "--engine", "nowhere")
    assert result.exit_code == 2 and "the engine must be embedded" in result.output


def test_serve_refuses_a_service_as_its_engine():
    result = CliRunner().invoke(app, ["serve", "--engine", "http://elsewhere:8000"])
    assert result.exit_code == 2 and "serve evaluates on this machine or a Ray cluster" in result.output


def test_every_engine_is_opened_by_one_function():
    """bench, train, eval's batches, the verl plugin and the OpenEnv server open their evaluator with
    scheduling.evaluator.open_evaluator; serve its backend with scheduling.engine.open_backend, which open_evaluator
    uses too."""
    import drkernel

    package = Path(drkernel.__file__).parent
    openers: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        text = path.read_text()
        for name in ("open_evaluator(", "open_backend(", "RayBackend(", "Scheduler(", "service.client import"):
            if name in text.replace(f"def {name}", "") and "class " + name.rstrip("(") not in text:
                openers.setdefault(name, set()).add(str(path.relative_to(package)))
    assert openers["RayBackend("] == openers["Scheduler("] == {"scheduling/engine.py"}
    assert openers["service.client import"] == {"scheduling/evaluator.py"}
    assert openers["open_backend("] == {"scheduling/evaluator.py", "cli/serve.py"}
    assert openers["open_evaluator("] == {"agent/bench.py", "cli/batch.py", "train/run.py", "integrations/verl.py",
                                          "integrations/openenv_app.py"}


# --- options from the configs' fields --------------------------------------------------------------------------


def _help_line(command: str, option: str) -> str:
    text = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "400"}).output
    return next(line for line in text.splitlines() if f" {option} " in line)


@pytest.mark.parametrize("command", ["eval", "bench", "serve"])
def test_generated_help_shows_each_config_default_and_flags_take_no_value(command):
    from drkernel.schema import EvalOptions

    defaults = EvalOptions()
    assert "(default: auto)" in _help_line(command, "--device") and "<auto|cpu|cuda>" in _help_line(command, "--device")
    assert "(default: embedded)" in _help_line(command, "--engine")
    assert "(default: one per GPU" in _help_line(command, "--workers")
    if command != "serve":
        assert f"(default: {defaults.timeout_s})" in _help_line(command, "--timeout")
        assert f"(default: {defaults.correctness_trials})" in _help_line(command, "--trials")
        perf = _help_line(command, "--perf")
        assert "--no-perf" in perf and "<bool>" not in perf and "(default: --perf)" in perf


def test_boolean_options_are_flags(monkeypatch):
    """`--no-perf` and `--perf` are flags; `--no-perf true` was the only spelling help suggested, and it failed."""
    for args, measured in (([], True), (["--no-perf"], False), (["--perf"], True), (["--no-perf", "--perf"], True)):
        result, seen = _seen_by_run_batch(monkeypatch, *args)
        assert result.exit_code == 0, result.output
        assert seen["options"].measure_performance is measured
    result, seen = _seen_by_run_batch(monkeypatch, "--strict", "--trials", "2", "--device", "cpu")
    assert (seen["options"].allow_torch_glue, seen["options"].correctness_trials, seen["options"].device) == (
        False, 2, "cpu")
    result, _ = _seen_by_run_batch(monkeypatch, "--no-perf", "true")
    assert result.exit_code == 2  # 'true' is not an argument eval takes
    for command, option in (("bench", "--resume"), ("eval", "--json"), ("report", "--no-paper")):
        assert "<bool>" not in _help_line(command, option)


def test_bench_options_are_its_config_s_fields():
    """Every BenchConfig field but the nested ones is an option of bench, with the field's help."""
    import dataclasses

    from drkernel.agent.config import BenchConfig
    from drkernel.cli.bench import BENCH_FIELDS

    assert set(BENCH_FIELDS) == {f.name for f in dataclasses.fields(BenchConfig)} - {"evaluation", "engine"}
    assert "Trajectories per task. (default: 1)" in _help_line("bench", "--samples")


def test_one_evaluation_goes_to_the_engine_named(monkeypatch):
    """`eval -r -c --engine URL` is judged by that engine (it ran here whatever --engine said)."""
    from drkernel.schema import EvalResult, Status

    asked = []

    async def evaluate_all(engine, options, pairs, done=None):
        asked.append((engine.name, [(task.name, code) for task, code in pairs]))
        return [EvalResult(status=Status.CORRECT, correct=True)]

    monkeypatch.setattr(batch, "evaluate_all", evaluate_all)
    examples = Path(__file__).resolve().parent.parent / "examples"
    reference, candidate = examples / "tasks" / "2_relu.py", examples / "candidates" / "2_relu__triton.py"
    result = CliRunner().invoke(app, ["eval", "-r", str(reference), "-c", str(candidate), "--engine",
                                      "http://evalhost:8000", "--json"])
    assert result.exit_code == 0, result.output
    assert asked == [("http://evalhost:8000", [("2_relu", candidate.read_text())])]
    assert '"status": "correct"' in result.output
