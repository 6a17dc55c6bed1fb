"""A candidate reaches nothing of the user who runs drkernel: the user's own secrets (SSH keys, the Hugging Face
token, .netrc, a project's .env, the shell history), the home directory (no write), a port on 127.0.0.1, the user's
other processes (their environments, signals). As root the home is root's; run as an ordinary user
(tests/test_ordinary_user.py), the same checks hold for that user's home and processes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from drkernel.runner.supervisor import Supervisor
from drkernel.schema import EvalOptions, EvalRequest

REPO = Path(__file__).resolve().parents[1]
REFERENCE = (REPO / "examples" / "tasks" / "1_vector_add.py").read_text()
GOOD = (REPO / "examples" / "candidates" / "1_vector_add__triton.py").read_text()
DEVICE = os.environ.get("DRKERNEL_TEST_DEVICE", "cpu")
SECRET = f"drk-home-secret-{uuid.uuid4().hex}"
SECRET_FILES = [".ssh/id_ed25519", ".cache/huggingface/token", ".netrc", ".bash_history", "project/.env",
                ".config/drkernel-test/credentials"]

HUNTER = """
import ctypes, os, signal, socket, torch.nn as nn
loot = []
for name in {files!r}:
    try:
        loot.append(open(os.path.join({home!r}, name)).read())
    except OSError as exc:
        loot.append(type(exc).__name__)
try:
    loot.append(open('/proc/{sibling}/environ').read())
except OSError as exc:
    loot.append(type(exc).__name__)
try:
    with open(os.path.join({home!r}, 'written-by-candidate.txt'), 'w') as f:
        f.write('x')
except OSError as exc:
    loot.append(type(exc).__name__)
try:
    ctypes.CDLL(None).kill({sibling}, signal.SIGTERM)
except Exception as exc:
    loot.append(type(exc).__name__)
try:
    with socket.create_connection(('127.0.0.1', {port}), timeout=2) as s:
        loot.append(s.recv(200).decode())
except Exception as exc:
    loot.append(type(exc).__name__)
raise RuntimeError(' | '.join(loot))
"""


def options() -> EvalOptions:
    return EvalOptions(device=DEVICE, timeout_s=30, memory_limit_mb=2048, perf_trials=2, warmup_trials=1)


class Listener:
    """A port on 127.0.0.1 that hands the secret to whoever connects, and counts them."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        self.server.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            self.accepted += 1
            with conn:
                conn.sendall(SECRET.encode())

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.server.close()


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    """The secrets in the running user's home; only files that did not exist are made, and they are removed after."""
    root = Path.home()
    made = []
    for name in SECRET_FILES:
        path = root / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"token={SECRET}\n")
            path.chmod(0o600)
            made.append(path)
    try:
        yield root
    finally:
        for path in made:
            path.unlink(missing_ok=True)
        (root / "written-by-candidate.txt").unlink(missing_ok=True)


def test_a_candidate_reaches_nothing_of_the_user(home: Path) -> None:
    listener = Listener()
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                               env={**os.environ, "SIBLING_SECRET": SECRET})
    box = Supervisor(device=DEVICE, gpu="0" if DEVICE == "cuda" else None)
    try:
        source = HUNTER.format(files=SECRET_FILES, home=str(home), sibling=sibling.pid, port=listener.port)
        result = box.run(EvalRequest(REFERENCE, source, options()))
    finally:
        box.close()
        listener.close()
        alive = sibling.poll() is None
        sibling.send_signal(signal.SIGKILL)
        sibling.wait()
    text = result.to_json()
    assert result.status in ("runtime_error", "hacked") and result.error is not None, text
    assert SECRET not in text, text
    assert result.error.message.count("PermissionError") >= len(SECRET_FILES), result.error.message
    assert not (home / "written-by-candidate.txt").exists()
    assert alive, "the candidate's signal reached another process of the user"
    assert listener.accepted == 0, "the candidate connected to a port on 127.0.0.1"


def test_a_legitimate_kernel_is_correct_for_this_user() -> None:
    box = Supervisor(device=DEVICE, gpu="0" if DEVICE == "cuda" else None)
    try:
        result = box.run(EvalRequest(REFERENCE, GOOD, options()))
    finally:
        box.close()
    assert result.status == "correct", result.to_json(indent=1)
    expected_uid = os.environ.get("DRKERNEL_TEST_EXPECT_UID")
    if expected_uid is not None:  # run as an ordinary user by tests/test_ordinary_user.py
        assert os.geteuid() == int(expected_uid) != 0
        layers = result.environment.confinement
        assert layers["pid_namespace"] == "private, own /proc", layers
        assert layers["subject_channel"].startswith("the candidate's threads cannot reach it"), layers
