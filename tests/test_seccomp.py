"""The subject's system-call filters (drkernel.sandbox.seccomp), each tried in a fresh interpreter: a filter cannot be
removed, so none is ever installed in the test process itself."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest

from drkernel.sandbox import seccomp

pytestmark = pytest.mark.skipif(bool(seccomp.supported()), reason=seccomp.supported() or "")


def _run(body: str) -> dict:
    code = "import json, os, socket, threading, ctypes, errno\nfrom drkernel.sandbox import seccomp\n"
    code += textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_candidates_thread_cannot_touch_the_channel_and_the_harness_can() -> None:
    seen = _run("""
        harness, judge = socket.socketpair()
        fd = harness.fileno()
        other = os.open(os.devnull, os.O_WRONLY)
        seen = {}

        def _raise(number):
            raise OSError(number, os.strerror(number))

        def attempt(name, step):
            try:
                step()
                seen[name] = "allowed"
            except OSError as exc:
                seen[name] = errno.errorcode[exc.errno]

        def candidate():
            seccomp.install(seccomp.channel_filter([fd]))
            attempt("write", lambda: os.write(fd, b"forged"))
            attempt("read", lambda: os.read(fd, 1))
            attempt("dup", lambda: os.dup(fd))
            attempt("dup2", lambda: os.dup2(fd, 200))
            attempt("close", lambda: os.close(fd))
            attempt("fcntl", lambda: __import__("fcntl").fcntl(fd, __import__("fcntl").F_DUPFD, 300))
            attempt("sendmsg", lambda: harness.sendmsg([b"forged"]))
            attempt("shutdown", lambda: harness.shutdown(socket.SHUT_RDWR))
            libc = ctypes.CDLL(None, use_errno=True)
            number = seccomp.SYSCALLS[os.uname().machine][1]["close_range"]
            attempt("close_range", lambda: libc.syscall(number, fd, fd, 0) and _raise(ctypes.get_errno()))
            attempt("other descriptor", lambda: os.write(other, b"x"))
            started = threading.Thread(target=lambda: attempt("from a thread it started", lambda: os.write(fd, b"x")))
            started.start()
            started.join()

        thread = threading.Thread(target=candidate)
        thread.start()
        thread.join()
        os.write(fd, b"harness")
        seen["judge received"] = judge.recv(100).decode()
        print(json.dumps(seen))
    """)
    assert seen.pop("other descriptor") == "allowed"
    assert seen.pop("judge received") == "harness"  # nothing the candidate's thread tried reached the judge
    assert set(seen.values()) == {"EPERM"}, seen


def test_the_process_filter_refuses_tracing_namespaces_and_counters_and_keeps_threads_and_processes() -> None:
    seen = _run("""
        libc = ctypes.CDLL(None, use_errno=True)
        seccomp.install(seccomp.process_filter(), all_threads=True)
        seen = {}
        for name, call in (("unshare", lambda: libc.unshare(0x10000000)),
                           ("ptrace", lambda: libc.ptrace(16, os.getppid(), 0, 0)),
                           ("perf_event_open", lambda: libc.syscall(298 if os.uname().machine == "x86_64" else 241,
                                                                    0, 0, -1, -1, 0))):
            result = call()
            seen[name] = errno.errorcode.get(ctypes.get_errno(), "?") if result == -1 else "allowed"
        worker = threading.Thread(target=lambda: seen.__setitem__("thread", "ran"))
        worker.start()
        worker.join()
        seen["process"] = __import__("subprocess").run(["true"]).returncode
        print(json.dumps(seen))
    """)
    assert seen == {"unshare": "EPERM", "ptrace": "EPERM", "perf_event_open": "EPERM", "thread": "ran", "process": 0}


def test_programs_compile_for_each_architecture_and_name_only_known_calls() -> None:
    for machine in seccomp.SYSCALLS:
        for rules in (seccomp.process_filter(), seccomp.channel_filter([4095])):
            program = seccomp.compile_rules(rules, machine)
            assert len(program) % 8 == 0 and len(program) // 8 < seccomp.MAX_INSTRUCTIONS
    known = set(seccomp.SYSCALLS["x86_64"][1])
    assert set(seccomp.PROCESS_REFUSED) <= known and set(seccomp.CHANNEL_ARGUMENTS) <= known
    assert platform.machine() in seccomp.SYSCALLS or seccomp.supported()
