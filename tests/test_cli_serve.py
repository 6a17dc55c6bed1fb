"""`drkernel serve` and `drkernel report --serve` refusing what they cannot use, with the reason (exit code 2)."""

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


def test_a_bad_clients_file_is_a_usage_error(tmp_path) -> None:
    cases = {"[]": "expected a JSON object", '{"a": "short"}': "16+ characters",
             '{"a": "0123456789abcdef", "b": "0123456789abcdef"}': "two clients share a token",
             '{"a\\u0007": "0123456789abcdef"}': "printable"}
    for text, message in cases.items():
        (tmp_path / "clients.json").write_text(text)
        result = CliRunner().invoke(app, ["serve", "--clients-file", str(tmp_path / "clients.json"), "--store",
                                          str(tmp_path / "s.db")], env={"COLUMNS": "300"})
        assert result.exit_code == 2 and message in result.output, (text, result.output)


def test_report_needs_out_or_serve(tmp_path) -> None:
    result = CliRunner().invoke(app, ["report", str(tmp_path)], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "--out is needed to write a report (or --serve" in result.output
    result = CliRunner().invoke(app, ["report", "--serve", str(tmp_path)], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "no trajectories.jsonl (only bench runs can be browsed)" in result.output
