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


def test_serve_on_a_port_in_use_is_a_usage_error(tmp_path) -> None:
    """A port in use exits 2 with the reason, before any worker starts (friction 8; it exited 3)."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--port", str(port), "--store", str(tmp_path / "s.db")],
                                    env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert f"cannot listen on 127.0.0.1:{port}" in result.output
