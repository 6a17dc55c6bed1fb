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
