"""benchmarks/kernel_waits.py: parsing /proc, and a short sample of a sleeping process."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "kernel_waits", Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_waits.py")
kernel_waits = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(kernel_waits)


def test_the_state_is_read_past_a_command_name_with_spaces_and_parentheses():
    assert kernel_waits.state_of("42 (python3 (x) y) D 1 42 42 0") == "D"


def test_the_frames_kept_are_the_innermost_below_the_scheduler():
    stack = ("[<0>] __schedule+0x2f0/0x830\n[<0>] schedule+0x5a/0xd0\n[<0>] schedule_preempt_disabled+0x15/0x30\n"
             "[<0>] __mutex_lock.constprop.0+0x3c3/0x730\n[<0>] os_acquire_mutex+0x2e/0x40 [nvidia]\n"
             "[<0>] _nv012345rm+0x10/0x20 [nvidia]\n[<0>] rm_ioctl+0x63/0xb0 [nvidia]\n[<0>] nvidia_ioctl+0x1f/0x30\n")
    assert kernel_waits.inner_frames(stack) == "os_acquire_mutex < _nv012345rm < rm_ioctl"


def test_a_sleeping_process_is_seen_asleep(tmp_path):
    marker = "kernel_waits_probe_marker"
    sleeper = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(30)  # {marker}"])
    try:
        assert kernel_waits.main(["--seconds", "0.3", "--interval", "0.05", "--match", marker,
                                  "--out", str(tmp_path)]) == 0
    finally:
        sleeper.kill()
        sleeper.wait()
    report = json.loads((tmp_path / "kernel_waits.json").read_text())
    assert report["samples"] >= 3 and report["state"]["S"] >= 3
    assert sum(report["S_wchan"].values()) == report["state"]["S"]


def test_bad_arguments_are_a_usage_error(tmp_path):
    with pytest.raises(SystemExit):
        kernel_waits.main(["--seconds", "0", "--out", str(tmp_path)])


def test_told_to_stop_it_writes_what_it_saw(tmp_path):
    import signal
    import time

    sampler = subprocess.Popen([sys.executable, str(Path(kernel_waits.__file__)), "--seconds", "600",
                                "--out", str(tmp_path)])
    time.sleep(1.0)
    sampler.send_signal(signal.SIGTERM)
    assert sampler.wait(timeout=30) == 0
    assert json.loads((tmp_path / "kernel_waits.json").read_text())["samples"] >= 1
