"""drkernel's exceptions under one base, so a caller tells bad input from a failed engine from a bug in drkernel:

    DrkernelError
    ├── UsageError        bad input: an argument, a config, a file (the CLI prints it and exits 2)
    │     ConfigError, TaskLoadError, RunDirError, RunReadError, PublishedError, TemplateMismatch, EpisodeError,
    │     SyntheticError
    ├── EngineError       the evaluation engine failed or cannot be reached (the CLI prints it and exits 1)
    │     ForkServerDied, EvaluatorUnavailable, ServiceError
    └── GenerationError   a model request failed for good (drkernel.agent.backends; FatalGenerationError)

Any other exception escaping a command is a bug in drkernel, and the CLI shows its traceback. UsageError is also a
ValueError and EngineError a RuntimeError, so code that caught those built-ins still catches them.

Standard library only: drkernel.schema, which the sandboxed process loads, imports it.
"""

from __future__ import annotations


class DrkernelError(Exception):
    """Every error drkernel raises on purpose."""


class UsageError(DrkernelError, ValueError):
    """The input cannot be used as given; the message says what to change."""


class EngineError(DrkernelError, RuntimeError):
    """The evaluation engine (embedded scheduler, Ray cluster, `drkernel serve` service) failed or cannot be
    reached: no verdict can be had, whatever the candidate."""
