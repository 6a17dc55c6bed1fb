"""Shared test fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SELECTED = pytest.StashKey[list]()  # the test items this run selected (tests/test_hacking.py starts them at once)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash[SELECTED] = items


@pytest.fixture(scope="module")
def kernelbench_path() -> Path:
    """The real KernelBench levels 1-3 JSONL, which lives outside the repo (it is never copied in)."""
    configured = os.environ.get("DRKERNEL_KERNELBENCH")
    path = Path(configured) if configured else REPO.parent / "shared" / "kernelbench" / "kernelbench_levels1-3.jsonl"
    if not path.is_file():
        pytest.skip(f"KernelBench JSONL not found at {path}; set DRKERNEL_KERNELBENCH to its path to run this test")
    return path
