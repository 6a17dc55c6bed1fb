"""Judges that outlive their evaluations (drkernel.sandbox.judge_host): one judge process judges candidate after
candidate, each against a fresh subject. What a candidate does to its subject, to the process that forks subjects or
to its time limit ends at most its own evaluation and host, never the next evaluation's verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from drkernel.runner.supervisor import Supervisor
from drkernel.scheduling.scheduler import Scheduler
from drkernel.schema import EvalOptions, EvalRequest, EvalResult, Status

REPO = Path(__file__).resolve().parents[1]
TASK = (REPO / "examples" / "tasks" / "2_relu.py").read_text()
CANDIDATES = REPO / "examples" / "candidates"
OPTIONS = EvalOptions(device="cpu", perf_trials=3, warmup_trials=1, timeout_s=60)
RELU = (CANDIDATES / "2_relu__triton.py").read_text()
FORWARD = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
{body}
        return torch.relu(x)
"""


def forward(body: str) -> str:
    return FORWARD.format(body="\n".join(f"        {line}" for line in body.splitlines()))


@pytest.fixture(scope="module")
def supervisor() -> Iterator[Supervisor]:
    made = Supervisor(device="cpu", judge_hosts=True)
    yield made
    made.close()


def judged(supervisor: Supervisor, source: str, options: EvalOptions = OPTIONS) -> tuple[EvalResult, int]:
    """The verdict, and the pid of the judge host that gave it."""
    prepared = supervisor.prepare(EvalRequest(TASK, source, options))
    result = supervisor.finish(prepared)
    assert prepared.handle is not None and prepared.handle.pid is not None
    return result, prepared.handle.pid


def test_one_judge_process_judges_candidate_after_candidate(supervisor: Supervisor) -> None:
    expected = {"2_relu__triton": Status.CORRECT, "2_relu__wrong": Status.INCORRECT,
                "2_relu__pytorch_only": Status.HACKED, "2_relu__syntax_error": Status.COMPILE_ERROR}
    hosts = set()
    for name, status in [*expected.items(), ("2_relu__triton", Status.CORRECT)]:
        result, host = judged(supervisor, (CANDIDATES / f"{name}.py").read_text())
        assert result.status == status.value, (name, result.status, result.error)
        hosts.add(host)
    assert len(hosts) == 1  # the judge's process stayed; each candidate had a subject of its own
    assert result.speedup is not None and result.environment is not None
    assert result.environment.confinement.get("subject_landlock")  # the subject confined itself as ever


def test_a_crashed_subject_ends_its_evaluation_not_its_host(supervisor: Supervisor) -> None:
    crashed, host = judged(supervisor, forward("import ctypes\nctypes.string_at(0)"))
    assert crashed.status == Status.CRASHED.value and "SIGSEGV" in crashed.error.message
    result, same = judged(supervisor, RELU)
    assert result.status == Status.CORRECT.value and same == host


def test_a_timeout_ends_the_host_and_the_next_evaluation_gets_a_new_one(supervisor: Supervisor) -> None:
    _, before = judged(supervisor, RELU)
    assert supervisor.hosts is not None
    (home,) = [host.home for host in supervisor.hosts._free]  # one evaluation at a time on the CPU: one host
    looping = EvalOptions(device="cpu", perf_trials=3, warmup_trials=1, timeout_s=8)
    result, host = judged(supervisor, forward("while True:\n    pass"), looping)
    assert result.status == Status.TIMEOUT.value and host == before
    assert not home.exists()  # the ended host's folder went with it
    result, after = judged(supervisor, RELU)
    assert result.status == Status.CORRECT.value and after != host


def test_a_candidate_that_kills_the_process_forking_subjects_is_refused(supervisor: Supervisor) -> None:
    """Native code gets past the audit hook (ctypes is recorded, not refused), and its parent is the forker: as root
    the subject's uid may not signal it; as an ordinary user it may, and the host ends after its verdict."""
    result, host = judged(supervisor, forward("import ctypes, os\nctypes.CDLL(None).kill(os.getppid(), 9)"))
    assert result.status == Status.HACKED.value and {"sandbox_violation", "killed_harness"} & set(result.hack_reasons)
    result, _ = judged(supervisor, RELU)
    assert result.status == Status.CORRECT.value


def test_judge_hosts_at_once_share_the_devices_gate() -> None:
    """Two hosts judging at once hold the GPU's gate as one-evaluation judges do (opened before the judge gives up
    its uid: the lock files are the supervisor's), each evaluation with its own account of it."""
    from drkernel.runner.supervisor import DeviceQueue

    two = Supervisor(device="cpu", judge_hosts=True, overlap=2)
    try:
        queue = DeviceQueue(two)
        results = [f.result() for f in [queue.submit(EvalRequest(TASK, RELU, OPTIONS)) for _ in range(4)]]
    finally:
        two.close()
    assert [r.status for r in results] == ["correct"] * 4, [r.error for r in results]
    assert all(r.phases_s["gate_alone"] > 0 for r in results)  # each timed alone, and each its own account


@pytest.mark.parametrize("judge_hosts", [True, False], ids=["judge-hosts", "a-judge-per-evaluation"])
def test_a_scheduler_gives_every_verdict_with_the_judges_it_was_asked_for(judge_hosts: bool) -> None:
    """Its workers judge as the scheduler says: a judge per evaluation confines itself in each evaluation's time
    (a `confine` phase), a judge host once before its first."""
    names = ["2_relu__triton", "2_relu__wrong", "2_relu__pytorch_only", "2_relu__triton"]
    requests = [EvalRequest(TASK, (CANDIDATES / f"{n}.py").read_text(), OPTIONS) for n in names]
    with Scheduler(device="cpu", workers=1, judge_hosts=judge_hosts, cache_entries=0) as scheduler:
        results = scheduler.evaluate_many(requests)
    assert [r.status for r in results] == ["correct", "incorrect", "hacked", "correct"]
    assert all(("confine" in r.phases_s) is not judge_hosts for r in results)


def test_the_red_team_through_judge_hosts() -> None:
    """The legitimate candidates and the exploits that end, kill or take over the subject's process or forge its
    evidence, each judged by a judge that outlives its evaluations (every exploit, as an ordinary user:
    tests/test_ordinary_user.py)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(REPO),
                           "-k", "legit or k1 or k2 or k4 or k5 or m1 or m3 or m4 or n1 or q",
                           str(REPO / "tests" / "test_hacking.py")], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "DRKERNEL_TEST_JUDGE_HOSTS": "1"}, timeout=900)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0 and " passed" in tail and " failed" not in tail, tail


def test_a_hosts_folder_is_searchable_so_that_its_subjects_take_the_judges_uid() -> None:
    """Started as root where the installation is readable by all, the judge drops to an unprivileged uid and makes
    each subject's folder as that uid; the subject, forked by a process that kept root's, drops to the same uid only
    if every folder above its own is searchable, and would otherwise keep root's uid without the capabilities to
    write to its folder (every evaluation a `runtime_error`)."""
    made = Supervisor(device="cpu", judge_hosts=True)
    try:
        before = set(made.root.glob("judge-*"))
        result, _ = judged(made, RELU)
        homes = set(made.root.glob("judge-*")) - before
        assert result.status == Status.CORRECT
        assert homes and all(path.stat().st_mode & 0o777 == 0o711 for path in homes)
    finally:
        made.close()
