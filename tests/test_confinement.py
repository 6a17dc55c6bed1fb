"""Candidates read nothing that is not theirs: hostile candidates (tests/confinement/) hunt for secrets planted in
the supervisor's environment and command line, another process's, a 0600 store and a world-readable file under
/tmp, root's home, /etc/shadow, and echo what they find through every channel a result has (exception message,
exception class name, traceback, stdout/stderr of a crash). Every byte that comes back through the Python API,
the CLI and the service is searched for the secrets.
"""

from __future__ import annotations

import ast
import glob
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from drkernel.runner.supervisor import Supervisor
from drkernel.sandbox import landlock
from drkernel.schema import EvalOptions, EvalRequest

REPO = Path(__file__).resolve().parents[1]
REFERENCE = (REPO / "examples" / "tasks" / "1_vector_add.py").read_text()
GOOD = (REPO / "examples" / "candidates" / "1_vector_add__triton.py").read_text()
HOSTILE = {Path(p).stem: Path(p).read_text() for p in sorted(glob.glob(str(REPO / "tests" / "confinement" / "*.py")))}
DEVICE = os.environ.get("DRKERNEL_TEST_DEVICE", "cpu")  # "cuda" runs the same cases on a GPU machine
SECRET = f"drk-secret-{uuid.uuid4().hex}"
ROOT = os.geteuid() == 0


def options() -> EvalOptions:
    return EvalOptions(device=DEVICE, timeout_s=30, memory_limit_mb=2048, perf_trials=2, warmup_trials=1)


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """The secret in every place a candidate must not reach; yields what must never come back."""
    monkey = pytest.MonkeyPatch()
    for name in ("DRKERNEL_TOKEN", "AWS_SECRET_ACCESS_KEY", "DRKERNEL_TEST_SECRET"):
        monkey.setenv(name, SECRET)
    files = [Path("/tmp") / f"drkernel-test-{SECRET}.txt", tmp_path_factory.mktemp("server") / "service.db"]
    files[0].write_text(SECRET)
    os.chmod(files[0], 0o644)  # world-readable: only Landlock keeps it out
    with sqlite3.connect(files[1]) as db:
        db.execute("CREATE TABLE submissions (candidate TEXT)")
        db.execute("INSERT INTO submissions VALUES (?)", (SECRET,))
    os.chmod(files[1], 0o600)
    if ROOT:
        files.append(Path("/root") / f".drkernel-test-{uuid.uuid4().hex}")
        files[-1].write_text(SECRET)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", SECRET],
                             env={**os.environ, "OTHER_SECRET": SECRET})
    shadow = [line for line in _read("/etc/shadow").splitlines() if len(line.split(":")[1]) > 2]
    try:
        yield [SECRET] + shadow
    finally:
        other.kill()
        other.wait()
        for path in files:
            path.unlink(missing_ok=True)
        monkey.undo()


@pytest.fixture(scope="module")
def supervisor(planted: list[str]) -> Iterator[Supervisor]:
    # Its fork server starts with the secrets in this process's environment.
    box = Supervisor(device=DEVICE, gpu="0" if DEVICE == "cuda" else None)
    yield box
    box.close()


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def assert_clean(text: str, planted: list[str]) -> None:
    leaked = [secret[:20] for secret in planted if secret in text]
    assert not leaked, f"leaked {leaked}: {text[:3000]}"


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_candidate_gets_nothing_back(supervisor: Supervisor, planted: list[str], name: str) -> None:
    result = supervisor.run(EvalRequest(REFERENCE, HOSTILE[name], options()))
    assert result.status in ("runtime_error", "crashed", "hacked"), result.to_json(indent=1)
    assert_clean(result.to_json(), planted)


def test_the_layers_are_applied_and_reported(supervisor: Supervisor, planted: list[str]) -> None:
    probe = GOOD.replace("import torch\n", "import os, torch\nSEEN = sorted(os.listdir('/proc'))\n", 1)
    probe = probe.replace("class ModelNew", "print('seen', [p for p in SEEN if p.isdigit()], os.getpid())\n"
                                            "raise RuntimeError(str([p for p in SEEN if p.isdigit()]))\nclass ModelNew", 1)
    result = supervisor.run(EvalRequest(REFERENCE, probe, options()))
    layers = result.environment.confinement
    abi = landlock.abi_version()
    if not abi:
        assert layers["landlock"].startswith("unavailable: ")
    elif DEVICE == "cpu":
        assert layers["landlock"] == f"abi {abi}"  # no thread runs before confinement on the CPU
    else:
        assert layers["landlock"].startswith(f"abi {abi}")
    if ROOT or os.environ.get("DRKERNEL_TEST_EXPECT_UID"):  # as an ordinary user, in a user namespace
        assert layers["pid_namespace"] == "private, own /proc"
        seen = ast.literal_eval(result.error.message)
        if supervisor.hosts is None:  # the reaper (PID 1), the judge, itself: no other process
            assert seen == ["1", "2", "3"]
        else:  # the reaper, the judge host, at most its forker, and itself
            assert {"1", "2"} <= set(seen) and len(seen) <= 4, seen
    if ROOT:
        assert layers["uid"] == "65534" or layers["uid"].startswith("0 without capabilities")
    good = supervisor.run(EvalRequest(REFERENCE, GOOD, options()))
    assert good.status == "correct", good.to_json(indent=1)
    assert {k: v for k, v in good.environment.confinement.items() if not k.startswith("subject_")} == layers
    assert good.environment.confinement["subject_channel"].startswith("the candidate's threads cannot reach it")
    assert good.environment.confinement["subject_seccomp"].startswith("no tracing")
    if supervisor.hosts is None:  # a judge host confines itself once, and its subject before the evaluation
        assert 0 <= good.phases_s["confine"] < 1.0


def test_drkernel_evaluate_returns_no_secret(planted: list[str]) -> None:
    import drkernel

    result = drkernel.evaluate(REFERENCE, HOSTILE["proc_environ_cmdline"], options())
    assert result.status == "runtime_error"
    assert_clean(result.to_json(), planted)


def test_cli_returns_no_secret(planted: list[str], tmp_path: Path) -> None:
    (tmp_path / "ref.py").write_text(REFERENCE)
    (tmp_path / "cand.py").write_text(HOSTILE["libc_direct"])
    proc = subprocess.run(
        [sys.executable, "-m", "drkernel.cli.main", "eval", "-r", str(tmp_path / "ref.py"), "-c",
         str(tmp_path / "cand.py"), "--device", DEVICE, "--timeout", "30", "--perf-trials", "2", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert '"status": "crashed"' in proc.stdout
    assert_clean(proc.stdout + proc.stderr, planted)


@pytest.mark.slow
def test_service_returns_no_secret(planted: list[str], tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    import httpx
    from tests.test_service_api import TOKEN
    from tests.test_service_e2e import server

    store = tmp_path / "service.db"
    with server(store) as running:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=running.url, headers=auth, timeout=60) as http:
            items = [{"reference": REFERENCE, "candidate": source, "options": options().to_dict()}
                     for source in HOSTILE.values()]
            ids = [http.post("/v1/evaluations", json=item).json()["id"] for item in items]
            texts = [http.get(f"/v1/evaluations/{id}", params={"wait": 60}).text for id in ids]
            texts.append(http.get("/metrics").text)
    assert all('"state":"done"' in t.replace(" ", "") for t in texts[:-1]), texts
    assert_clean("\n".join(texts), planted)
    assert (store.stat().st_mode & 0o777) == 0o600


def test_the_traceback_holds_the_candidates_frames_only(supervisor: Supervisor) -> None:
    source = GOOD.replace("class ModelNew", "def helper():\n    raise KeyError('own')\n\n\nclass ModelNew", 1)
    source = source.replace("    def forward(self, ", "    def forward(self, *args):\n        helper()\n\n    def unused(self, ", 1)
    result = supervisor.run(EvalRequest(REFERENCE, source, options()))
    assert result.error is not None and result.error.kind == "KeyError", result.to_json(indent=1)
    frames = [line.strip() for line in result.error.traceback.splitlines() if line.strip().startswith("File ")]
    assert frames and all(frame.startswith('File "candidate.py"') for frame in frames), result.error.traceback
    assert "drkernel" not in result.error.traceback and "site-packages" not in result.error.traceback
