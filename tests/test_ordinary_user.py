"""The suites that guard the verdicts and the confinement, run again as an ordinary (non-root) user: drkernel's users
are not root, and a check that needs root must never pass here by accident.

Started as root (CI is), each test drops to an unprivileged uid through tests/ordinary_user.py. Started as an
ordinary user, the whole suite already runs unprivileged, and these tests have nothing to add.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ordinary_user

REPO = Path(__file__).resolve().parents[1]
UID = 61_000 + os.getpid() % 1000  # no process of the machine runs as it
SUITES = ["tests/test_isolation.py", "tests/test_hacking.py", "tests/test_confinement.py",
          "tests/test_home_confinement.py", "tests/test_judge_hosts.py"]
TASK = REPO / "examples" / "tasks" / "2_relu.py"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="already an ordinary user: every suite runs unprivileged")


def _run(argv: list[str], user_namespaces: bool = True, timeout: float = 900,
         extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    home = Path("/home") / f"drkernel-test-{UID}"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "DRKERNEL_TEST_EXPECT_UID": str(UID), "TMPDIR": str(home),
           **(extra_env or {})}
    try:
        return subprocess.run(ordinary_user.command(UID, home, argv, user_namespaces), cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=timeout)
    finally:
        subprocess.run(["rm", "-rf", str(home)], check=False)


@pytest.fixture(scope="module")
def user_namespaces_here() -> None:
    """What the tests with user namespaces need of the machine (CI's allows them; some hosts refuse them)."""
    proc = _run([sys.executable, "-m", "drkernel.cli.main", "doctor", "--json"], timeout=120)
    layers = {layer["name"]: layer for layer in json.loads(proc.stdout)["layers"]}
    if not layers["pid_namespace"]["active"]:
        pytest.skip(f"this machine refuses user namespaces: {layers['pid_namespace']['detail']}")


def test_the_guarding_suites_pass_as_an_ordinary_user(user_namespaces_here: None) -> None:
    proc = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                 "--rootdir", str(REPO), "--basetemp", f"/home/drkernel-test-{UID}/pytest",
                 *[str(REPO / suite) for suite in SUITES]])
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail, tail


def test_the_red_team_with_a_judge_per_evaluation_as_an_ordinary_user(user_namespaces_here: None) -> None:
    """Every exploit and legitimate candidate again, each judged by a judge process of its own (judge hosts off)."""
    proc = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(REPO),
                 "--basetemp", f"/home/drkernel-test-{UID}/pytest", str(REPO / "tests" / "test_hacking.py")],
                extra_env={"DRKERNEL_TEST_JUDGE_HOSTS": "0"})
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0 and " passed" in tail and " failed" not in tail, tail


@pytest.mark.parametrize("user_namespaces", [True, False], ids=["user-namespaces", "user-namespaces-refused"])
def test_verdicts_as_an_ordinary_user(user_namespaces_here: None, user_namespaces: bool) -> None:
    """A legitimate kernel is correct and a forged answer is refused, with and without user namespaces; without them
    the missing layers are named on stderr before the evaluation starts."""
    verdicts = {}
    for candidate in ("examples/candidates/2_relu__triton.py", "tests/exploits/n1_channel_taken_over.py"):
        proc = _run([sys.executable, "-m", "drkernel.cli.main", "eval", "-r", str(TASK), "-c", str(REPO / candidate),
                     "--device", "cpu", "--json"], user_namespaces, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(proc.stdout)
        verdicts[Path(candidate).stem] = result["status"]
        layers = result["environment"]["confinement"]
        assert layers["uid"].startswith(str(UID)), layers
        if user_namespaces:
            assert "confinement incomplete" not in proc.stderr
            assert layers["pid_namespace"] == "private, own /proc", layers
        else:
            assert "confinement incomplete" in proc.stderr and "pid_namespace" in proc.stderr, proc.stderr
            assert layers["pid_namespace"].startswith("unavailable"), layers
    assert verdicts == {"2_relu__triton": "correct", "n1_channel_taken_over": "runtime_error"}, verdicts


def test_doctor_names_the_missing_layers_and_the_fix(user_namespaces_here: None) -> None:
    proc = _run([sys.executable, "-m", "drkernel.cli.main", "doctor", "--json"], user_namespaces=False, timeout=120)
    assert proc.returncode == 1, proc.stderr
    layers = {layer["name"]: layer for layer in json.loads(proc.stdout)["layers"]}
    assert json.loads(proc.stdout)["uid"] == UID
    assert not layers["pid_namespace"]["active"] and "seccomp profile" in layers["pid_namespace"]["fix"]
    assert layers["landlock"]["active"] == (layers["landlock"]["detail"] != "this kernel has no Landlock")
    proc = _run([sys.executable, "-m", "drkernel.cli.main", "doctor", "--json"], timeout=120)
    assert proc.returncode == 0 and all(layer["active"] for layer in json.loads(proc.stdout)["layers"]), proc.stdout
