"""The app the manifest names (`server.app:app`) and the `server` console script: drkernel's OpenEnv server with its
default tasks, configured by DRKERNEL_ENV_* variables or by the flags of `drkernel-openenv`
(drkernel.integrations.openenv_app says which)."""

from drkernel.integrations.openenv_app import app
from drkernel.integrations.openenv_app import main as serve

__all__ = ["app", "main"]


def main() -> int:
    """`uv run server`, `python -m server.app` (from this folder) and the `server` script."""
    return serve()


if __name__ == "__main__":
    raise SystemExit(main())
