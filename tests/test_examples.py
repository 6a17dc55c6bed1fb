"""Every example candidate gets the verdict its first line announces, through the batch CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def expected_statuses() -> dict[str, str]:
    expected = {}
    for path in sorted((EXAMPLES / "candidates").glob("*.py")):
        match = re.match(r"# expected: (\w+)", path.read_text())
        assert match, f"{path.name} lacks its '# expected: <status>' first line"
        expected[path.stem] = match.group(1)
    return expected


def test_batch_cli_gives_each_example_its_expected_verdict(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "drkernel.cli.main", "eval", "--tasks", str(EXAMPLES / "tasks"),
         "--candidates", str(EXAMPLES / "candidates"), "--device", "cpu", "--perf-trials", "3",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    got = {row["candidate"]: row["result"]["status"] for row in rows}
    assert got == expected_statuses()
    for row in rows:
        result = row["result"]
        assert result["correct"] == (result["status"] == "correct")
        if not result["correct"]:
            assert result["error"] or result["hack_reasons"], row
    assert "Fast@1.2" in proc.stdout and "correct rate" in proc.stdout
    assert "interpreter" in proc.stdout  # CPU timings are labelled as such


def test_batch_cli_rejects_unmatched_candidates(tmp_path: Path) -> None:
    (tmp_path / "99_nothing__x.py").write_text("x = 1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "drkernel.cli.main", "eval", "--tasks", str(EXAMPLES / "tasks"),
         "--candidates", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "99_nothing" in proc.stderr
