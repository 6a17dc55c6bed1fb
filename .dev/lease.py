"""One driver for a lease of the GPU machine, in place of the per-lease shell scripts (docs/experiments.md, "The
runs on the GPU").

A lease is several device calls in a row: each carries at most 64 MiB (the tree included) and 8 named paths, and
/tmp survives only while the calls follow each other. Lease 18 lost a call because one call's carry, added up by
hand, passed the 64 MiB; here the carry plan is computed and checked before any call, and the calls and the
daemon that outlives them are one tested program instead of seven near-copies of shell.

    python3 .dev/lease.py plan DIR --gguf CHUNK... [--piece PIECE...] --run NAME ...   here: DIR/plan.json,
                                                                                           DIR/spec.json, the calls
    python3 .dev/lease.py call DIR K [--lease-s 1490] [--watch-s W]   there, call K of the plan
    python3 .dev/lease.py watch DIR [--watch-s 420]                   there, a call that carries nothing new
    python3 .dev/lease.py daemon DIR --pack-by EPOCH                  there, started detached by call 1
    python3 .dev/lease.py stop [--grace-s 10]                         there, the daemon of {mini}/daemon.pid
                                                                           and its process group (never pkill -f:
                                                                           it matches the call's own shell)

Every path on the machine lies under one root (--root-tmp or $LEASE_ROOT_TMP, default /tmp). Commands in the spec
(--miniature, --while-waiting, --after) may name {mini} {state} {out} {repo} {gguf}, filled in there.
Standard library only (with drkernel.train.checkpoints, which is too): it runs under the machine's python3 before
the wheels are in.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # drkernel from this checkout
import bundle  # noqa: E402  (.dev/bundle.py, beside this file)
from drkernel.sandbox import procfs  # noqa: E402  (standard library only, as this driver must be)
from drkernel.train.checkpoints import last_checkpoint  # noqa: E402  (the checkpoint `drkernel train --resume` takes)

MIB = 1 << 20
MARGIN_BYTES = MIB  # under the call's limit: plan.json, written after the sizes are taken, and rounding
MAX_CARRY = 8
MAX_COMMAND = 2000
MAX_OUT_FILES, MAX_OUT_BYTES = 8, 16 * MIB
PACK_RESERVE_S = 50  # kept after the RL run and the "after" commands for packing what comes back
HOST_LOG_S = 120
WATCH_POLL_S = 10.0
LEASE_ENV = {"PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
             "NVSHMEM_DISABLE_NVLS": "1"}
VERSIONED = ("torch", "triton", "transformers", "trl", "peft")
DEFAULT_RL_SET = {"num_generations": "4", "per_device_train_batch_size": "8", "gradient_accumulation_steps": "2"}
RUNS_TGZ_PATHS = ("rl", "bench", "logs", "lease.log", "host.log", "sft/sft_summary.json")
RUNS_TGZ_SKIP = ("checkpoint-*", "*.safetensors", "*.bin", "*.pt")


# ---------------------------------------------------------------------------------------------------------- spec

@dataclass
class Timed:
    """A shell command of the spec, with its own timeout and (for "after" commands) the time it needs left."""
    command: str
    timeout_s: float
    min_left_s: float = 0.0


@dataclass
class Spec:
    """What the daemon does in one lease (DIR/spec.json)."""
    run: str
    rl_set: dict[str, str] = field(default_factory=dict)
    bench: bool = False
    resume: bool = False
    while_waiting: list[Timed] = field(default_factory=list)
    after: list[Timed] = field(default_factory=list)
    expect_sft_digest: str = "fa16adbdf55b3fc0ec020c3a2867aab135e420270cf67c17ea423e2fe6d0924a"
    mix: str = "docs/data/miniature-h100-2026-11-26/sft/sft_mix.jsonl.gz"
    miniature: str = "python3 benchmarks/miniature.py --root {mini} --base {gguf}"
    gguf_name: str = "SmolLM2-135M-Instruct.Q4_1.gguf"
    extra_paths: list[str] = field(default_factory=list)  # under {mini}, into runs.tgz
    piece_mib: float = 12.0
    gguf_wait_s: float = 600.0
    checkpoint_wait_s: float = 240.0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> Spec:
        data = json.loads(text)
        _check_keys(cls, data, where)
        for key in ("while_waiting", "after"):
            for item in data.get(key, []):
                _check_keys(Timed, item, f"{where} {key}")
            data[key] = [Timed(**item) for item in data.get(key, [])]
        try:
            return cls(**data)
        except TypeError as error:
            raise SystemExit(f"{where}: {error}") from None


def _check_keys(cls: type, data: dict, where: str) -> None:
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise SystemExit(f"{where}: unknown key(s) {', '.join(unknown)}")


def parse_timed(text: str, with_min_left: bool) -> Timed:
    """'TIMEOUT:CMD' (--while-waiting) or 'MIN_LEFT:TIMEOUT:CMD' (--after)."""
    parts = text.split(":", 2 if with_min_left else 1)
    try:
        numbers = [float(p) for p in parts[:-1]]
    except ValueError:
        numbers = []
    if len(numbers) != len(parts) - 1 or len(parts) != (3 if with_min_left else 2) or not parts[-1].strip():
        shape = "MIN_LEFT:TIMEOUT:CMD" if with_min_left else "TIMEOUT:CMD"
        raise SystemExit(f"{text!r}: not {shape} (seconds, then the shell command)")
    if with_min_left:
        return Timed(parts[2], timeout_s=numbers[1], min_left_s=numbers[0])
    return Timed(parts[1], timeout_s=numbers[0])


@dataclass(frozen=True)
class Roots:
    """Where a lease's files lie on the machine: all under one folder, so that tests run in a temporary one."""
    tmp: Path

    mini = property(lambda self: self.tmp / "mini")
    state = property(lambda self: self.tmp / "state")
    out = property(lambda self: self.tmp / "out")
    repo = property(lambda self: self.tmp / "repo")
    site = property(lambda self: self.tmp / "site")
    gguf_store = property(lambda self: self.tmp / "bundle")
    checkpoint_store = property(lambda self: self.tmp / "ckstore")
    checkpoint_in = property(lambda self: self.tmp / "ckin")
    staging = property(lambda self: self.tmp / "ckdir")
    done = property(lambda self: self.tmp / "mini" / "DONE")
    daemon_pid = property(lambda self: self.tmp / "mini" / "daemon.pid")
    lease_log = property(lambda self: self.tmp / "mini" / "lease.log")
    host_log = property(lambda self: self.tmp / "mini" / "host.log")

    def fill(self, command: str, spec: Spec) -> str:
        """The spec's command with the roots named ({mini} ...) filled in."""
        names = {"mini": self.mini, "state": self.state, "out": self.out, "repo": self.repo,
                 "gguf": self.state / spec.gguf_name}
        for name, path in names.items():
            command = command.replace("{" + name + "}", str(path))
        return command

    def env(self) -> dict[str, str]:
        """The environment of pre.sh: the wheels and the repository importable, NVLink multicast off."""
        return {**os.environ, **LEASE_ENV, "PYTHONPATH": f"{self.repo}:{self.site}"}


# ---------------------------------------------------------------------------------------------------------- plan

def path_bytes(path: Path) -> int:
    """A file's size, or a folder's files' sizes together (a folder in a call's carry travels whole)."""
    if path.is_file():
        return path.stat().st_size
    return sum((Path(top) / name).lstat().st_size for top, _, names in os.walk(path) for name in names)


def tree_bytes(repo: Path) -> int:
    """The working tree as a device call sends it: tracked files and untracked ones git does not ignore."""
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                             check=True, capture_output=True).stdout.decode()
    return sum((repo / name).lstat().st_size for name in listing.split("\0") if name and (repo / name).is_file())


def chunk_order(paths: list[Path], what: str) -> list[Path]:
    """The chunks of one bundle, all of them, in order; anything else is an error naming what is wrong."""
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"{what}: no file {path}")
    matches = [bundle.CHUNK.match(p.name) for p in paths]
    if not all(matches):
        raise SystemExit(f"{what}: not chunks of `bundle.py pack` (bundle-ID-KofN): "
                         f"{', '.join(str(p) for p, m in zip(paths, matches) if not m)}")
    bundles = {(m["id"], int(m["n"])) for m in matches}
    if len(bundles) != 1:
        raise SystemExit(f"{what}: chunks of {len(bundles)} bundles; give the chunks of one")
    (_, count), = bundles
    numbers = sorted(int(m["k"]) for m in matches)
    if numbers != list(range(1, count + 1)):
        raise SystemExit(f"{what}: give all {count} chunks of the bundle once each (given: {numbers})")
    return sorted(paths, key=lambda p: int(bundle.CHUNK.match(p.name)["k"]))


@dataclass
class Call:
    """One device call of the plan: what it carries beside the tree."""
    carry: list[str]
    carry_bytes: int
    gguf: list[str] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    completes: list[str] = field(default_factory=list)  # "gguf", "checkpoint": the bundles whose last chunk it holds

    def fits(self, size: int, budget: int) -> bool:
        return len(self.carry) < MAX_CARRY and self.carry_bytes + size <= budget


def assign_calls(tree: int, spec_dir: str, spec_dir_bytes: int, wheels: str, wheels_bytes: int,
                 gguf: list[tuple[str, int]], pieces: list[tuple[str, int]], limit_bytes: int) -> list[Call]:
    """GGUF chunk k in call k (the wheels with the first), then each checkpoint piece in the earliest call with
    room, a call opened after the last where none has; every call also carries spec_dir. Sizes in bytes."""
    budget = limit_bytes - MARGIN_BYTES - tree

    def too_big(path: str, size: int, beside: int) -> SystemExit:
        return SystemExit(f"{path} ({size / MIB:.1f} MiB) cannot travel: with the tree ({tree / MIB:.1f} MiB) and "
                          f"{beside / MIB:.1f} MiB beside it, a call would carry "
                          f"{(tree + beside + size) / MIB:.1f} MiB, over the limit {limit_bytes / MIB:.1f} MiB "
                          f"less {MARGIN_BYTES / MIB:.0f} MiB")

    calls = []
    for k, (path, size) in enumerate(gguf, start=1):
        call = Call([wheels, spec_dir] if k == 1 else [spec_dir], spec_dir_bytes + (wheels_bytes if k == 1 else 0))
        if not call.fits(size, budget):
            raise too_big(path, size, call.carry_bytes)
        call.carry.append(path)
        call.carry_bytes += size
        call.gguf.append(path)
        calls.append(call)
    calls[-1].completes.append("gguf")
    for path, size in pieces:
        call = next((c for c in calls if c.fits(size, budget)), None)
        if call is None:
            call = Call([spec_dir], spec_dir_bytes)
            if not call.fits(size, budget):
                raise too_big(path, size, call.carry_bytes)
            calls.append(call)
        call.carry.append(path)
        call.carry_bytes += size
        call.pieces.append(path)
    if pieces:
        max((c for c in calls if c.pieces), key=calls.index).completes.append("checkpoint")
    return calls


def relative_to_repo(path: Path, repo: Path, what: str) -> str:
    resolved = path.resolve()
    if not resolved.is_relative_to(repo):
        raise SystemExit(f"{what} {path} is outside the repository {repo}: a call carries only its paths")
    return str(resolved.relative_to(repo))


def call_command(spec_dir: str, k: int) -> str:
    command = f"python3 .dev/lease.py call {spec_dir} {k}"
    if len(command) > MAX_COMMAND:
        raise SystemExit(f"call {k}'s command is {len(command)} characters, over the {MAX_COMMAND} a call takes")
    return command


def make_plan(repo: Path, spec_dir: Path, gguf: list[Path], pieces: list[Path], wheels: Path, limit_mib: float,
              spec: Spec, tree: int | None = None) -> dict:
    """DIR/spec.json and DIR/plan.json (nothing written when a file cannot travel); returns the plan."""
    if not gguf:
        raise SystemExit("a plan needs the GGUF's chunks (--gguf)")
    if not wheels.is_dir():
        raise SystemExit(f"no wheels folder {wheels}")
    gguf, pieces = chunk_order(gguf, "--gguf"), chunk_order(pieces, "--piece") if pieces else []
    for folder, what in ((spec_dir, "DIR"), (wheels, "--wheels")):
        inside = [p for p in gguf + pieces if p.resolve().is_relative_to(folder.resolve())]
        if inside:
            raise SystemExit(f"{what} {folder} holds {inside[0]}: a folder travels whole, so keep the chunks out")
    tree = tree_bytes(repo) if tree is None else tree
    spec_text = spec.to_json()
    spec_dir_bytes = len(spec_text.encode()) + sum(
        path_bytes(p) for p in spec_dir.glob("*") if p.name not in ("spec.json", "plan.json"))
    rel = {p: relative_to_repo(p, repo, "path") for p in [spec_dir, wheels, *gguf, *pieces]}
    calls = assign_calls(tree, rel[spec_dir], spec_dir_bytes, rel[wheels], path_bytes(wheels),
                         [(rel[p], p.stat().st_size) for p in gguf],
                         [(rel[p], p.stat().st_size) for p in pieces], int(limit_mib * MIB))
    plan = {"dir": rel[spec_dir], "wheels": rel[wheels], "tree_mib": round(tree / MIB, 2), "limit_mib": limit_mib,
            "calls": [{**dataclasses.asdict(c), "total_mib": round((tree + c.carry_bytes) / MIB, 2),
                       "command": call_command(rel[spec_dir], k)} for k, c in enumerate(calls, start=1)]}
    spec_dir.mkdir(parents=True, exist_ok=True)
    (spec_dir / "spec.json").write_text(spec_text)
    (spec_dir / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    return plan


def describe_plan(plan: dict) -> str:
    lines = [f"tree {plan['tree_mib']:.1f} MiB; limit {plan['limit_mib']} MiB a call; {len(plan['calls'])} calls, "
             "one right after the other"]
    for k, call in enumerate(plan["calls"], start=1):
        what = [f"GGUF {Path(p).name}" for p in call["gguf"]] + [f"piece {Path(p).name}" for p in call["pieces"]]
        done = f"; completes {', '.join(call['completes'])}" if call["completes"] else ""
        lines += [f"call {k}: {call['total_mib']:.1f} MiB ({', '.join(what) or 'nothing new'}{done})",
                  f"  command: {call['command']}",
                  f"  carry: {json.dumps(call['carry'])}"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------- calls

def say(message: str) -> None:
    print(f"=== {time.strftime('%H:%M:%S', time.gmtime())} {message}", flush=True)


def load_plan(spec_dir: Path) -> tuple[dict, Spec]:
    for name in ("plan.json", "spec.json"):
        if not (spec_dir / name).is_file():
            raise SystemExit(f"no {spec_dir / name}: run `lease.py plan` here first")
    plan = json.loads((spec_dir / "plan.json").read_text())
    return plan, Spec.from_json((spec_dir / "spec.json").read_text(), str(spec_dir / "spec.json"))


def copy_tree(source: Path, dest: Path, leave_out: set[Path]) -> None:
    """The call's tree into dest (it outlives the call), without the chunks: they go to the stores."""
    leave_out = {p.resolve() for p in leave_out}
    shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True,
                    ignore=lambda top, names: [n for n in names if (Path(top) / n).resolve() in leave_out])


def install_wheels(wheels: Path, site: Path) -> None:
    """The carried wheels into site, once a machine (pre.sh)."""
    found = sorted(wheels.glob("*.whl"))
    if (site / ".ok").exists() or not found:
        print(f"wheels: {'installed before' if found else f'none in {wheels}'}", flush=True)
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, found)], check=True)
    (site / ".ok").touch()


def add_chunks(paths: list[str], store: Path, unpack_into: Path | None) -> None:
    """bundle.py's add; with unpack_into, the whole bundle unpacked beside and moved in at once (the daemon waits
    for the files, so it must never see half of one)."""
    if not paths:
        return
    if unpack_into is None:
        bundle.add([Path(p) for p in paths], store, None)
        return
    unpack_into.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=unpack_into.parent, prefix=".unpack-") as part:
        if bundle.add([Path(p) for p in paths], store, Path(part)) != 0:
            raise SystemExit("a bundle is incomplete on this machine: carry its chunks again from call 1")
        unpack_into.mkdir(parents=True, exist_ok=True)
        for item in Path(part).iterdir():
            os.replace(item, unpack_into / item.name)
            print(f"in place: {unpack_into / item.name}", flush=True)


def add_call_files(call: dict, roots: Roots) -> None:
    add_chunks(call["gguf"], roots.gguf_store, roots.state if "gguf" in call["completes"] else None)
    add_chunks(call["pieces"], roots.checkpoint_store,
               roots.checkpoint_in if "checkpoint" in call["completes"] else None)


def launch_detached(argv: list[str], log: Path, cwd: Path, env: dict[str, str], pid_file: Path) -> None:
    """The daemon in a session of its own (setsid nohup): it outlives the call that starts it. Its pid, which is
    also its process group's, into pid_file: `stop` and the next lease's call 1 find it there."""
    with open(log, "ab") as out:
        process = subprocess.Popen(["nohup", *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   cwd=cwd, env=env, start_new_session=True)
    pid_file.write_text(f"{process.pid}\n")


def read_pid(pid_file: Path) -> int | None:
    """The daemon's pid from its file; None when there is no file."""
    try:
        text = pid_file.read_text().strip()
    except FileNotFoundError:
        return None
    if not text.isdigit():
        raise SystemExit(f"{pid_file} holds {text[:40]!r}, not a pid: look at it, then remove it by hand")
    return int(text)


def live_members(pgid: int) -> list[int]:
    """The processes of a process group that still run, from /proc (Linux, as the machine is). Zombies do not
    count: an orphaned daemon stays one where nothing on the machine reaps it."""
    return [process.pid for process in procfs.processes() if process.state != "Z" and process.pgrp == pgid]


def daemon_running(pid: int) -> bool:
    """Whether pid runs and leads its own process group, as a daemon of launch_detached does (a reused pid does
    not, most likely)."""
    return pid in live_members(pid)


def wait_gone(pgid: int, seconds: float) -> bool:
    end = time.time() + seconds
    while live_members(pgid) and time.time() < end:
        time.sleep(0.1)
    return not live_members(pgid)


def stop(roots: Roots, grace_s: float) -> str:
    """The daemon of daemon.pid ended with its process group: SIGTERM, SIGKILL after grace_s. By pid only:
    `pkill -f "lease.py daemon"` also matched the call's own `bash -c` and killed the call. Returns what it did."""
    pid = read_pid(roots.daemon_pid)
    if pid is None:
        return f"no daemon.pid ({roots.daemon_pid})"
    if not daemon_running(pid):
        roots.daemon_pid.unlink()
        return f"no daemon running (pid file stale: {pid})"
    os.killpg(pid, signal.SIGTERM)
    how = "ended on SIGTERM"
    if not wait_gone(pid, grace_s):
        os.killpg(pid, signal.SIGKILL)
        how = f"SIGKILL after {grace_s:g} s"
        wait_gone(pid, 5.0)
    roots.daemon_pid.unlink(missing_ok=True)  # the daemon removes it itself when it ends on SIGTERM
    return f"stopped daemon {pid} (process group): {how}"


def clear_warm(roots: Roots) -> None:
    """A warm machine (the next lease's call 1 within 30 s of the last call) keeps /tmp. A daemon still running
    there is refused; an earlier lease's DONE would end this lease's watch at once, and its results in roots.out
    would come back as this lease's: both go."""
    pid = read_pid(roots.daemon_pid)
    if pid is not None and daemon_running(pid):
        raise SystemExit(f"a daemon from an earlier lease is still running on this warm machine (pid {pid}): "
                         "`python3 .dev/lease.py stop` first, or watch it")
    if roots.done.exists():
        print(f"warm machine: an earlier lease's files lie under {roots.tmp}; stages that find their outputs skip "
              f"them; the earlier lease's {roots.done} is removed now", flush=True)
        roots.done.unlink()
    earlier = sorted(roots.out.iterdir()) if roots.out.is_dir() else []
    if earlier:
        print(f"removed from {roots.out}, the earlier lease's: {', '.join(p.name for p in earlier)}", flush=True)
    for path in earlier:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def first_call(plan: dict, spec_dir: str, roots: Roots, lease_s: float, launch=launch_detached,
               first_log_s: float = 15.0) -> None:
    """Call 1: the tree to roots.repo, the wheels, the first chunk, then the daemon, packing by now + lease_s."""
    clear_warm(roots)
    for folder in (roots.mini, roots.repo, roots.state, roots.out):
        folder.mkdir(parents=True, exist_ok=True)
    chunks = {Path(p) for call in plan["calls"] for p in call["gguf"] + call["pieces"]}
    copy_tree(Path.cwd(), roots.repo, chunks)
    install_wheels(Path(plan["wheels"]), roots.site)
    add_call_files(plan["calls"][0], roots)
    pack_by = int(time.time() + lease_s)
    log_start = roots.lease_log.stat().st_size if roots.lease_log.exists() else 0  # a warm machine's earlier log
    launch([sys.executable, str(roots.repo / ".dev" / "lease.py"), "daemon", str(roots.repo / spec_dir),
            "--pack-by", str(pack_by), "--root-tmp", str(roots.tmp)], roots.lease_log, roots.repo, roots.env(),
           roots.daemon_pid)
    print(f"daemon started, packing by {time.strftime('%H:%M:%S', time.gmtime(pack_by))} UTC", flush=True)
    time.sleep(first_log_s)
    with open(roots.lease_log, "rb") as log:
        log.seek(log_start)
        print("".join(log.read().decode(errors="replace").splitlines(keepends=True)[:40]), end="", flush=True)
    print(f"nproc {os.cpu_count()}; {memory_line()}", flush=True)


def gpu_query(fields: str) -> str:
    if not shutil.which("nvidia-smi"):
        return ""
    return subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip()


def memory_line() -> str:
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        return "memory: no /proc/meminfo"
    values = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
    return f"memory total {values['MemTotal'].strip()}, available {values.get('MemAvailable', '?').strip()}"


def progress_report(roots: Roots) -> str:
    """The log's tail, each RL run's steps and rewards, the benches' summaries, the GPUs' load."""
    lines = roots.lease_log.read_text(errors="replace").splitlines()[-50:] if roots.lease_log.exists() else []
    for metrics in sorted(roots.mini.glob("rl/*/metrics.jsonl")):
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        lines.append(f"{metrics}: {len(rows)} steps; rewards {[round(r.get('reward_mean', -1), 2) for r in rows]}")
    for summary_path in sorted(roots.mini.glob("*/*/summary.json")):
        summary = json.loads(summary_path.read_text())
        lines.append(f"{summary_path}: first answers fast_1_2 {summary.get('per_turn', {}).get('fast_1_2')}, best "
                     f"{summary.get('best_of_history', {}).get('fast_1_2')}, incomplete "
                     f"{summary.get('incomplete_trajectories')}")
    if gpus := gpu_query("index,utilization.gpu,memory.used"):
        lines.append(gpus)
    return "\n".join(lines)


def watch(roots: Roots, watch_s: float) -> bool:
    """Wait for the daemon's DONE (at most watch_s), report, and at DONE copy what comes back to $OUT."""
    end = time.time() + watch_s
    while not roots.done.exists() and time.time() < end:
        time.sleep(min(WATCH_POLL_S, max(0.0, end - time.time())))
    print(progress_report(roots), flush=True)
    if not roots.done.exists():
        print("not done yet (`lease.py watch DIR` watches on, within 30 s of this call)", flush=True)
        return False
    out = os.environ.get("OUT")
    if not out:
        raise SystemExit("DONE, but no $OUT to copy the results into")
    for item in sorted(roots.out.iterdir()):
        if item.is_file():
            shutil.copy2(item, Path(out) / item.name)
            print(f"{Path(out) / item.name} {item.stat().st_size / MIB:.2f} MiB", flush=True)
    return True


def run_call(spec_dir: Path, k: int, roots: Roots, lease_s: float, watch_s: float | None) -> None:
    """Call k of the plan: its chunks and pieces into the stores (unpacked where a bundle completes); call 1 then
    starts the daemon, a later call watches it (the last call of the plan 420 s by default, others only report)."""
    plan, _ = load_plan(spec_dir)
    if not 1 <= k <= len(plan["calls"]):
        raise SystemExit(f"the plan has calls 1 to {len(plan['calls'])}, not {k}")
    os.environ.update(LEASE_ENV)
    if k == 1:
        first_call(plan, str(spec_dir), roots, lease_s)
        return
    add_call_files(plan["calls"][k - 1], roots)
    watch(roots, (420.0 if k == len(plan["calls"]) else 0.0) if watch_s is None else watch_s)


# ---------------------------------------------------------------------------------------------------------- daemon

@dataclass
class Lease:
    """The daemon's inputs: the spec, where things lie, and when packing must start."""
    spec: Spec
    roots: Roots
    pack_by: float

    def left_s(self) -> float:
        """Seconds the work may still take, PACK_RESERVE_S kept for packing."""
        return self.pack_by - PACK_RESERVE_S - time.time()

    @property
    def miniature(self) -> str:
        return self.roots.fill(self.spec.miniature, self.spec)

    @property
    def run_dir(self) -> Path:
        return self.roots.mini / "rl" / self.spec.run


def shell(lease: Lease, title: str, command: str, timeout_s: float | None = None) -> int:
    """A stage's command in the repository, logged with its rc (124 when stopped at its timeout, its whole
    process group with it)."""
    say(title)
    sys.stdout.flush()
    process = subprocess.Popen(command, shell=True, cwd=lease.roots.repo, env=lease.roots.env(),
                               start_new_session=True)
    try:
        rc = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        rc = 124
    except BaseException:  # the daemon stopped (`stop`): its stage, in a session of its own, must not outlive it
        os.killpg(process.pid, signal.SIGKILL)
        raise
    say(f"{title}: rc {rc}")
    return rc


def guarded(title: str, stage, *args):
    """A stage whose failure is logged and does not end the lease; None when it raised."""
    try:
        return stage(*args)
    except Exception:  # noqa: BLE001 - the lease goes on, the traceback is in its log
        say(f"{title} FAILED")
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        return None


def wait_for(path: Path, seconds: float, poll_s: float = 2.0) -> bool:
    end = time.time() + seconds
    while not path.exists() and time.time() < end:
        time.sleep(poll_s)
    return path.exists()


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def stage_environment(lease: Lease) -> None:
    say(f"start; pack by {time.strftime('%H:%M:%S', time.gmtime(lease.pack_by))} UTC; run {lease.spec.run}")
    print(gpu_query("index,name,driver_version,memory.total") or "no nvidia-smi")
    versions = []
    for name in VERSIONED:
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} missing")
    print("; ".join(versions))
    print(f"nproc {os.cpu_count()}; {memory_line()}", flush=True)


def host_snapshot() -> str:
    lines = [f"--- {time.strftime('%H:%M:%S', time.gmtime())} {Path('/proc/loadavg').read_text().strip()}"
             if Path("/proc/loadavg").exists() else f"--- {time.strftime('%H:%M:%S', time.gmtime())}"]
    if shutil.which("top"):
        top = subprocess.run(["top", "-b", "-n", "1", "-w", "200", "-o", "%CPU"], capture_output=True, text=True)
        lines += top.stdout.splitlines()[6:32]
    if gpus := gpu_query("index,utilization.gpu,memory.used"):
        lines.append(gpus)
    return "\n".join(lines) + "\n"


def watch_host(log: Path, stop: threading.Event) -> None:
    """The host's load, top processes and GPUs every HOST_LOG_S into host.log, until the lease is packed."""
    while not stop.is_set():
        with open(log, "a") as f:
            f.write(host_snapshot())
        stop.wait(HOST_LOG_S)


def stage_mix(lease: Lease) -> None:
    """The carried SFT mix where `splits mix` finds it, so that it has nothing to build."""
    mix = lease.roots.repo / lease.spec.mix
    data = lease.roots.mini / "sft_data"
    data.mkdir(parents=True, exist_ok=True)
    if mix.exists():
        with gzip.open(mix, "rb") as source, open(data / "sft.jsonl", "wb") as dest:
            shutil.copyfileobj(source, dest)
    else:
        say(f"no carried mix at {lease.spec.mix}: `splits mix` builds it")
    shell(lease, "splits mix", f"{lease.miniature} splits mix --gpus 1")


def stage_policy(lease: Lease) -> bool:
    """The GGUF, the base and the SFT policy; the SFT weights' digest against the spec's. True when RL can run."""
    gguf = lease.roots.state / lease.spec.gguf_name
    say(f"waiting for {gguf.name} (at most {lease.spec.gguf_wait_s:.0f} s)")
    if not wait_for(gguf, lease.spec.gguf_wait_s):
        say(f"NO GGUF at {gguf}: no base, SFT or RL in this lease")
        return False
    if shell(lease, "base", f"{lease.miniature} base --gpus 1") != 0:
        return False
    if shell(lease, "sft", f"{lease.miniature} sft --gpus 1") != 0:
        return False
    summary = lease.roots.mini / "sft" / "sft_summary.json"
    digest = json.loads(summary.read_text()).get("weights_sha256") if summary.exists() else None
    if digest == lease.spec.expect_sft_digest:
        say(f"SFT weights as expected ({digest})")
    else:
        say(f"SFT weights DIFFER from the expected {lease.spec.expect_sft_digest}: {digest}")
    return True


def stage_resume(lease: Lease) -> bool:
    """The carried checkpoint's run folder into rl/, where `rl` resumes it. True when RL can run."""
    if not lease.spec.resume:
        return True
    carried = lease.roots.checkpoint_in / lease.spec.run
    say(f"waiting for the checkpoint {carried} (at most {lease.spec.checkpoint_wait_s:.0f} s)")
    if not wait_for(carried, lease.spec.checkpoint_wait_s):
        say(f"NO CHECKPOINT at {carried}: RL skipped")
        return False
    lease.run_dir.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(carried), str(lease.run_dir))
    say(f"resuming from {sorted(p.name for p in lease.run_dir.glob('checkpoint-*'))}")
    return True


def stage_rl(lease: Lease) -> None:
    limit = int(lease.left_s())
    if limit <= 0:
        say(f"rl {lease.spec.run}: no time left ({limit} s)")
        return
    settings = " ".join(f"--rl-set {key}={value}" for key, value in lease.spec.rl_set.items())
    stages = "rl bench" if lease.spec.bench else "rl"
    shell(lease, f"{stages} {lease.spec.run}, stopped after {limit} s",
          f"{lease.miniature} {stages} --gpus 1 --policies {lease.spec.run} {settings} --time-limit-s {limit}")
    adapter = lease.run_dir / "final" / "adapter_model.safetensors"
    say(f"adapter sha256 {sha256(adapter)}" if adapter.exists() else f"no final adapter: {lease.spec.run} unfinished")


def stage_timed(lease: Lease, kind: str, timed: Timed) -> None:
    """A spec's command, skipped when less than its min_left_s is left, its timeout capped by the time left."""
    left = lease.left_s()
    if left < timed.min_left_s:
        say(f"{kind} skipped ({left:.0f} s left, needs {timed.min_left_s:.0f}): {timed.command}")
        return
    shell(lease, f"{kind}: {timed.command}", lease.roots.fill(timed.command, lease.spec),
          timeout_s=max(1.0, min(timed.timeout_s, left)))


def pack_checkpoint(lease: Lease) -> None:
    """An unfinished run: its folder and last whole checkpoint as bundle pieces, for the next lease to resume."""
    if not lease.run_dir.is_dir() or (lease.run_dir / "final").exists():
        return
    found = last_checkpoint(lease.run_dir)
    if found is None:
        say(f"{lease.run_dir}: unfinished and no whole checkpoint, nothing to resume")
        return
    checkpoint = Path(found)
    say(f"packing {lease.run_dir} with {checkpoint.name}")
    staged = lease.roots.staging / lease.spec.run
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(lease.run_dir, staged, ignore=shutil.ignore_patterns("checkpoint-*"))
    shutil.copytree(checkpoint, staged / checkpoint.name)
    for piece in bundle.pack(lease.roots.out, [str(staged)], int(lease.spec.piece_mib * MIB)):
        print(f"{sha256(piece)}  {piece.name}", flush=True)


def pack_runs(lease: Lease) -> None:
    """The records (no weights) as runs.tgz."""
    mini = lease.roots.mini
    skip = lambda info: None if any(Path(info.name).match(p) for p in RUNS_TGZ_SKIP) else info  # noqa: E731
    with tarfile.open(lease.roots.out / "runs.tgz", "w:gz") as tar:
        for name in (*RUNS_TGZ_PATHS, *lease.spec.extra_paths):
            if (mini / name).exists():
                tar.add(mini / name, arcname=name, filter=skip)


def pack_adapter(lease: Lease) -> None:
    final = lease.run_dir / "final"
    if final.is_dir():
        with tarfile.open(lease.roots.out / "adapter.tgz", "w:gz") as tar:
            tar.add(final, arcname=".")


def check_out(out: Path) -> None:
    """What comes back must fit a call's return: say so loudly when it does not."""
    files = sorted(p for p in out.iterdir())
    for path in files:
        print(f"{path.name} {path.stat().st_size / MIB:.2f} MiB")
    big = [p.name for p in files if p.stat().st_size > MAX_OUT_BYTES]
    if len(files) > MAX_OUT_FILES or big:
        say(f"WARNING: {out} holds {len(files)} files (at most {MAX_OUT_FILES} come back), over "
            f"{MAX_OUT_BYTES // MIB} MiB: {big}; NOT ALL OF IT WILL COME BACK")


def stopped(signum: int, frame) -> None:
    """SIGTERM as an exception, so that run_daemon's finally packs and the running stage is killed with it."""
    raise SystemExit(f"stopped by signal {signum}")


def run_daemon(lease: Lease) -> None:
    """The lease's stages in order; whatever fails, what there is gets packed and DONE is written. SIGTERM (from
    `stop`) ends the stages the same way, and daemon.pid goes when the daemon ends."""
    signal.signal(signal.SIGTERM, stopped)
    roots = lease.roots
    for folder in (roots.mini, roots.out, roots.mini / "rl"):
        folder.mkdir(parents=True, exist_ok=True)
    packed = threading.Event()
    try:
        guarded("environment", stage_environment, lease)
        threading.Thread(target=watch_host, args=(roots.host_log, packed), daemon=True).start()
        guarded("mix", stage_mix, lease)
        for timed in lease.spec.while_waiting:
            guarded("while waiting", stage_timed, lease, "while waiting", timed)
        if guarded("policy", stage_policy, lease) and guarded("resume", stage_resume, lease):
            guarded("rl", stage_rl, lease)
        for timed in lease.spec.after:
            guarded("after", stage_timed, lease, "after", timed)
    finally:
        say("pack")
        for title, stage in (("checkpoint", pack_checkpoint), ("runs.tgz", pack_runs), ("adapter", pack_adapter)):
            guarded(title, stage, lease)
        guarded("out", check_out, roots.out)
        packed.set()
        roots.done.touch()
        roots.daemon_pid.unlink(missing_ok=True)
        say("done")


# ---------------------------------------------------------------------------------------------------------- CLI

def spec_from_args(args: argparse.Namespace) -> Spec:
    rl_set = {**DEFAULT_RL_SET, "max_steps": str(args.steps)}
    for item in args.rl_set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--rl-set {item!r}: not KEY=VALUE")
        rl_set[key] = value
    defaults = Spec(run=args.run)
    return Spec(run=args.run, rl_set=rl_set, bench=args.bench, resume=args.resume,
                while_waiting=[parse_timed(t, False) for t in args.while_waiting],
                after=[parse_timed(t, True) for t in args.after],
                expect_sft_digest=args.expect_sft_digest or defaults.expect_sft_digest,
                mix=args.mix or defaults.mix, miniature=args.miniature or defaults.miniature,
                extra_paths=args.extra_path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    planning = commands.add_parser("plan", help="the calls and their carry (here)")
    planning.add_argument("dir", type=Path, help="the lease's folder (git-ignored): spec.json, plan.json")
    planning.add_argument("--gguf", nargs="+", type=Path, default=[], help="the GGUF bundle's chunks")
    planning.add_argument("--piece", nargs="+", type=Path, default=[], help="a checkpoint bundle's pieces")
    planning.add_argument("--wheels", type=Path, default=Path(".whl"))
    planning.add_argument("--limit-mib", type=float, default=64.0)
    planning.add_argument("--run", required=True, help="the RL run's name (--policies)")
    planning.add_argument("--steps", type=int, default=30)
    planning.add_argument("--rl-set", action="append", default=[], metavar="KEY=VALUE",
                          help=f"over the defaults {DEFAULT_RL_SET} and max_steps=--steps")
    planning.add_argument("--bench", action="store_true", help="the run's bench after it (`rl bench`)")
    planning.add_argument("--resume", action="store_true", help="resume the run from the carried pieces")
    planning.add_argument("--while-waiting", action="append", default=[], metavar="TIMEOUT:CMD")
    planning.add_argument("--after", action="append", default=[], metavar="MIN_LEFT:TIMEOUT:CMD")
    planning.add_argument("--expect-sft-digest", default=None)
    planning.add_argument("--mix", default=None, help="the carried SFT mix (.jsonl.gz, in the tree)")
    planning.add_argument("--miniature", default=None, help="the miniature's command ({mini}, {gguf} filled in)")
    planning.add_argument("--extra-path", action="append", default=[], help="more of {mini} into runs.tgz")
    root_tmp = argparse.ArgumentParser(add_help=False)
    root_tmp.add_argument("--root-tmp", type=Path, default=Path(os.environ.get("LEASE_ROOT_TMP", "/tmp")))
    calling = commands.add_parser("call", parents=[root_tmp], help="call K of the plan (there)")
    calling.add_argument("dir", type=Path)
    calling.add_argument("k", type=int)
    calling.add_argument("--lease-s", type=float, default=1490.0, help="call 1: the daemon packs by now + this")
    calling.add_argument("--watch-s", type=float, default=None,
                         help="a later call's watch (default: 420 in the plan's last call, 0 before it)")
    watching = commands.add_parser("watch", parents=[root_tmp], help="only watch the daemon (there)")
    watching.add_argument("dir", type=Path)
    watching.add_argument("--watch-s", type=float, default=420.0)
    daemon = commands.add_parser("daemon", parents=[root_tmp], help="the lease's stages (there, detached)")
    daemon.add_argument("dir", type=Path)
    daemon.add_argument("--pack-by", type=float, required=True, help="epoch second by which all is packed")
    stopping = commands.add_parser("stop", parents=[root_tmp], help="the daemon of daemon.pid (there)")
    stopping.add_argument("--grace-s", type=float, default=10.0, help="SIGKILL after this long")
    args = parser.parse_args(argv)

    if args.command == "plan":
        repo = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True,
                                   text=True).stdout.strip()).resolve()
        plan = make_plan(repo, args.dir, args.gguf, args.piece, args.wheels, args.limit_mib, spec_from_args(args))
        print(describe_plan(plan))
        return 0
    roots = Roots(args.root_tmp.resolve())
    if args.command == "call":
        run_call(args.dir, args.k, roots, args.lease_s, args.watch_s)
    elif args.command == "watch":
        watch(roots, args.watch_s)
    elif args.command == "stop":
        print(stop(roots, args.grace_s), flush=True)
    else:
        _, spec = load_plan(args.dir)
        run_daemon(Lease(spec, roots, args.pack_by))
    return 0


if __name__ == "__main__":
    sys.exit(main())
