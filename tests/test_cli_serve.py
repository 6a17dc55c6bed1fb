"""`drkernel serve` without its extra: the install hint must survive the console's markup."""

from __future__ import annotations

import sys

from typer.testing import CliRunner

from drkernel.cli.main import app


def test_serve_without_the_extra_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # `import uvicorn` raises ImportError
    result = CliRunner().invoke(app, ["serve", "--port", "8123"], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "error: the service needs its extra: pip install 'drkernel[serve]' (import of uvicorn halted" in result.output
