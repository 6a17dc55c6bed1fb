""".dev/lease.py: a lease's calls planned within what a call carries (lease 18 lost a call to a hand-made
plan), the GGUF moved in only whole, and the daemon's stages with a stub miniature: what comes back is packed and
DONE written whatever fails."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.scripts import REPO, load_script

MIB = 1 << 20
STUB = '''
import argparse, json, os, sys
from pathlib import Path
parser = argparse.ArgumentParser()
parser.add_argument("stages", nargs="+")
parser.add_argument("--root", type=Path)
parser.add_argument("--base")
parser.add_argument("--gpus")
parser.add_argument("--policies", default=None)
parser.add_argument("--rl-set", action="append", default=[])
parser.add_argument("--time-limit-s", type=float, default=None)
args = parser.parse_args()
root, name = args.root, args.policies
record = {"stages": args.stages, "rl_set": args.rl_set, "time_limit_s": args.time_limit_s}
if "splits" in args.stages:
    record["mix_lines"] = len((root / "sft_data" / "sft.jsonl").read_text().splitlines())
if "base" in args.stages and not Path(args.base).exists():
    sys.exit(3)
if "sft" in args.stages:
    (root / "sft").mkdir(parents=True, exist_ok=True)
    (root / "sft" / "sft_summary.json").write_text(json.dumps({"weights_sha256": os.environ.get("STUB_DIGEST", "d1")}))
if "rl" in args.stages:
    run = root / "rl" / name
    record["found_checkpoints"] = sorted(p.name for p in run.glob("checkpoint-*"))
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"reward_mean": r}) + "\\n" for r in (0.1, 0.5)))
    # 11: cut before its trainer state; 12: cut while writing it (resume passes over both)
    for step, state in ((2, json.dumps({"step": 2})), (10, json.dumps({"step": 10})), (11, None), (12, '{"step": ')):
        (run / f"checkpoint-{step}").mkdir(exist_ok=True)
        (run / f"checkpoint-{step}" / "adapter_model.safetensors").write_bytes(os.urandom(30000))
        if state is not None:
            (run / f"checkpoint-{step}" / "trainer_state.json").write_text(state)
    if os.environ.get("STUB_FINISH"):
        (run / "final").mkdir(exist_ok=True)
        (run / "final" / "adapter_model.safetensors").write_bytes(b"adapter")
if "bench" in args.stages:
    (root / "bench" / name).mkdir(parents=True, exist_ok=True)
    (root / "bench" / name / "summary.json").write_text(json.dumps({"per_turn": {"fast_1_2": 0.25}}))
with open(root / "stub_calls.jsonl", "a") as f:
    f.write(json.dumps(record) + "\\n")
sys.exit(int(os.environ.get("STUB_SFT_RC", 0)) if "sft" in args.stages else 0)
'''


@pytest.fixture(scope="module")
def lease():
    return load_script(".dev/lease.py")


def _sparse(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def _lease18_files(tmp_path: Path, pieces_mib: tuple[float, ...]):
    gguf = [_sparse(tmp_path / ".carry" / "G3" / f"bundle-f22d7656aa2683d0-{k}of3", int(size * MIB))
            for k, size in ((3, 25.8), (1, 34), (2, 34))]  # given out of order: the plan orders them
    pieces = [_sparse(tmp_path / ".carry" / "ck" / f"bundle-daa3c4f854986122-{k}of{len(pieces_mib)}", int(size * MIB))
              for k, size in enumerate(pieces_mib, start=1)]
    _sparse(tmp_path / ".whl" / "trl.whl", int(2.7 * MIB))
    return gguf, pieces


def test_plan_puts_chunk_k_in_call_k_and_pieces_in_the_earliest_call_with_room(lease, tmp_path):
    gguf, pieces = _lease18_files(tmp_path, (12, 12, 12, 9.55))
    plan = lease.make_plan(tmp_path, tmp_path / "L", gguf, pieces, tmp_path / ".whl", 64, lease.Spec(run="r"),
                           tree=16 * MIB)
    calls = plan["calls"]
    assert [c["gguf"] for c in calls] == [[f".carry/G3/bundle-f22d7656aa2683d0-{k}of3"] for k in (1, 2, 3)] + [[]]
    # 63 MiB a call: 16 + 34 + 2.7 (wheels) leaves no 12 MiB in call 1, calls 2 and 3 have room for one piece
    # each, the third opens a fourth call, and the 9.55 MiB one goes back to call 1
    assert [[Path(p).name[-4:] for p in c["pieces"]] for c in calls] == [["4of4"], ["1of4"], ["2of4"], ["3of4"]]
    assert calls[0]["carry"] == [".whl", "L", ".carry/G3/bundle-f22d7656aa2683d0-1of3",
                                 ".carry/ck/bundle-daa3c4f854986122-4of4"]
    assert calls[3]["carry"] == ["L", ".carry/ck/bundle-daa3c4f854986122-3of4"]
    assert [c["completes"] for c in calls] == [[], [], ["gguf"], ["checkpoint"]]
    assert all(c["total_mib"] <= 63 for c in calls) and calls[2]["total_mib"] == pytest.approx(16 + 25.8 + 12, 0.01)
    for k, call in enumerate(calls, start=1):
        assert ".carry/G3" not in call["carry"] and ".carry/ck" not in call["carry"] and len(call["carry"]) <= 8
        assert call["command"] == f"python3 .dev/lease.py call L {k}" and len(call["command"]) <= 2000
    assert json.loads((tmp_path / "L" / "plan.json").read_text()) == plan
    assert lease.Spec.from_json((tmp_path / "L" / "spec.json").read_text(), "spec") == lease.Spec(run="r")


def test_plan_never_puts_two_12_mib_pieces_beside_the_last_chunk(lease, tmp_path):
    """Lease 18: chunk 3 with two pieces, the tree and the spec passed 64 MiB."""
    gguf, pieces = _lease18_files(tmp_path, (12, 12))
    calls = lease.make_plan(tmp_path, tmp_path / "L", gguf, pieces, tmp_path / ".whl", 64, lease.Spec(run="r"),
                            tree=16 * MIB)["calls"]
    last_chunk = next(c for c in calls if c["gguf"] == [".carry/G3/bundle-f22d7656aa2683d0-3of3"])
    assert len(last_chunk["pieces"]) < 2 and sum(len(c["pieces"]) for c in calls) == 2
    assert all(c["total_mib"] <= 63 for c in calls)


def test_plan_refuses_a_file_that_cannot_travel_and_writes_nothing(lease, tmp_path):
    gguf, pieces = _lease18_files(tmp_path, (12, 50))
    with pytest.raises(SystemExit) as error:
        lease.make_plan(tmp_path, tmp_path / "L", gguf, pieces, tmp_path / ".whl", 64, lease.Spec(run="r"),
                        tree=16 * MIB)
    message = str(error.value)
    assert ".carry/ck/bundle-daa3c4f854986122-2of2 (50.0 MiB)" in message
    assert "tree (16.0 MiB)" in message and "limit 64.0 MiB" in message
    assert not (tmp_path / "L").exists()
    with pytest.raises(SystemExit, match="bundle-f22d7656aa2683d0-1of3 .34.0 MiB"):  # the wheels beside chunk 1
        lease.make_plan(tmp_path, tmp_path / "L", gguf, [], tmp_path / ".whl", 50, lease.Spec(run="r"), tree=16 * MIB)


@pytest.mark.parametrize("case, message", [
    ("no gguf", "needs the GGUF's chunks"), ("missing chunk", r"give all 3 chunks"),
    ("chunks inside DIR", "a folder travels whole"), ("not a chunk", "not chunks of"),
])
def test_plan_says_what_is_wrong_with_its_input(lease, tmp_path, case, message):
    gguf, _ = _lease18_files(tmp_path, ())
    spec_dir = tmp_path / "L"
    if case == "no gguf":
        gguf = []
    elif case == "missing chunk":
        gguf = gguf[:2]
    elif case == "chunks inside DIR":
        spec_dir = tmp_path / ".carry"
    else:
        gguf = [_sparse(tmp_path / "model.gguf", 10)]
    with pytest.raises(SystemExit, match=message):
        lease.make_plan(tmp_path, spec_dir, gguf, [], tmp_path / ".whl", 64, lease.Spec(run="r"), tree=0)


def test_plan_command_counts_the_tree_as_git_sends_it(lease, tmp_path, monkeypatch, capsys):
    """Tracked and untracked files count, ignored ones (the chunks, the wheels, DIR) only where carried."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text(".carry/\n.whl/\nbig.bin\n")
    _sparse(tmp_path / "tracked.py", 3 * MIB)
    _sparse(tmp_path / "untracked.txt", 2 * MIB)
    _sparse(tmp_path / "big.bin", 40 * MIB)
    subprocess.run(["git", "add", "tracked.py", ".gitignore"], cwd=tmp_path, check=True)
    gguf, _ = _lease18_files(tmp_path, ())
    monkeypatch.chdir(tmp_path)
    assert lease.main(["plan", ".carry/L", "--gguf", *map(str, gguf), "--run", "recipe-s2", "--steps", "30",
                       "--while-waiting", "170:echo {out}"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("tree 5.0 MiB; limit 64.0 MiB a call; 3 calls")
    assert 'carry: [".whl", ".carry/L", ".carry/G3/bundle-f22d7656aa2683d0-1of3"]' in printed
    assert "command: python3 .dev/lease.py call .carry/L 3" in printed
    spec = json.loads((tmp_path / ".carry" / "L" / "spec.json").read_text())
    assert spec["rl_set"] == {"num_generations": "4", "per_device_train_batch_size": "8",
                              "gradient_accumulation_steps": "2", "max_steps": "30"}
    assert spec["while_waiting"] == [{"command": "echo {out}", "timeout_s": 170.0, "min_left_s": 0.0}]


def test_spec_json_with_an_unknown_key_is_an_error(lease):
    text = json.dumps({"run": "r", "max_stesp": 3})
    with pytest.raises(SystemExit, match="unknown key.*max_stesp"):
        lease.Spec.from_json(text, "spec.json")
    with pytest.raises(SystemExit, match="after.*unknown key.*tiemout"):
        lease.Spec.from_json(json.dumps({"run": "r", "after": [{"command": "x", "tiemout": 1}]}), "spec.json")
    with pytest.raises(SystemExit, match="MIN_LEFT:TIMEOUT:CMD"):
        lease.parse_timed("60:echo", with_min_left=True)


# ------------------------------------------------------------------------------------------------- the daemon

def _machine(lease, tmp_path: Path, spec, gguf: bool = True):
    """A temporary /tmp: the repository copy with the spec and the carried mix, the stub miniature, the GGUF."""
    roots = lease.Roots(tmp_path / "tmp")
    spec_dir = roots.repo / "L"
    spec_dir.mkdir(parents=True)
    (spec_dir / "plan.json").write_text("{}")
    with gzip.open(roots.repo / "mix.jsonl.gz", "wt") as f:
        f.write('{"a": 1}\n{"a": 2}\n')
    stub = tmp_path / "stub_miniature.py"
    stub.write_text(STUB)
    spec.mix = "mix.jsonl.gz"
    spec.miniature = f"{sys.executable} {stub} --root {{mini}} --base {{gguf}}"
    spec.gguf_wait_s = 0
    (spec_dir / "spec.json").write_text(spec.to_json())
    if gguf:
        _sparse(roots.state / spec.gguf_name, 100)
    return roots, spec_dir


def _run_daemon(roots, spec_dir, lease_s: float, **env):
    roots.mini.mkdir(parents=True, exist_ok=True)
    roots.daemon_pid.write_text("1\n")  # as launch_detached leaves it: the daemon removes it when it ends
    with open(roots.lease_log, "w") as log:
        subprocess.run([sys.executable, str(REPO / ".dev" / "lease.py"), "daemon", str(spec_dir),
                        "--pack-by", str(time.time() + lease_s), "--root-tmp", str(roots.tmp)],
                       stdout=log, stderr=subprocess.STDOUT, check=True, timeout=60, env={**os.environ, **env})
    assert not roots.daemon_pid.exists()
    calls = [json.loads(line) for line in (roots.mini / "stub_calls.jsonl").read_text().splitlines()]
    return roots.lease_log.read_text(), calls


def _positions(log: str, *needles: str) -> list[int]:
    return [log.index(needle) for needle in needles]


def test_daemon_packs_an_unfinished_run_as_pieces_with_its_last_whole_checkpoint(lease, tmp_path):
    spec = lease.Spec(run="grpo-s2", rl_set={"max_steps": "30"}, piece_mib=0.01,
                      while_waiting=[lease.Timed("sleep 30", timeout_s=1)],
                      after=[lease.Timed("echo late > {out}/late.txt", timeout_s=5, min_left_s=10_000),
                             lease.Timed("echo kb > {mini}/kb.log", timeout_s=5)],
                      extra_paths=["kb.log"])
    roots, spec_dir = _machine(lease, tmp_path, spec)
    log, calls = _run_daemon(roots, spec_dir, lease_s=200)

    order = _positions(log, "splits mix\n", "while waiting: sleep 30\n", "while waiting: sleep 30: rc 124",
                       "base\n", "sft\n", "rl grpo-s2, stopped after", "after skipped", "after: echo kb",
                       "pack\n", "done\n")
    assert order == sorted(order)
    assert "SFT weights DIFFER from the expected fa16adbdf55b" in log and ": d1" in log
    assert [c["stages"] for c in calls] == [["splits", "mix"], ["base"], ["sft"], ["rl"]]
    assert calls[0]["mix_lines"] == 2 and calls[3]["rl_set"] == ["max_steps=30"]
    assert 140 <= calls[3]["time_limit_s"] <= 150  # 200 s to the pack-by, 50 of them kept for packing
    assert (roots.done).exists() and not (roots.out / "late.txt").exists()
    assert "no final adapter: grpo-s2 unfinished" in log

    pieces = sorted(roots.out.glob("bundle-*"))
    assert len(pieces) >= 3 and not (roots.out / "adapter.tgz").exists()
    back = tmp_path / "back"
    subprocess.run([sys.executable, str(REPO / ".dev" / "bundle.py"), "add", *map(str, pieces), "--store",
                    str(tmp_path / "store"), "--unpack", str(back)], check=True, capture_output=True)
    assert sorted(p.name for p in (back / "grpo-s2").iterdir()) == ["checkpoint-10", "metrics.jsonl"]
    assert (back / "grpo-s2" / "checkpoint-10" / "trainer_state.json").exists()
    with tarfile.open(roots.out / "runs.tgz") as tar:
        names = tar.getnames()
    assert "rl/grpo-s2/metrics.jsonl" in names and "lease.log" in names and "kb.log" in names
    assert "sft/sft_summary.json" in names and not any("checkpoint-" in n or n.endswith(".safetensors") for n in names)


def test_daemon_resumes_the_carried_checkpoint_and_brings_back_the_finished_adapter(lease, tmp_path):
    spec = lease.Spec(run="grpo-s1", bench=True, resume=True, expect_sft_digest="d1", checkpoint_wait_s=5)
    roots, spec_dir = _machine(lease, tmp_path, spec)
    _sparse(roots.checkpoint_in / "grpo-s1" / "checkpoint-5" / "trainer_state.json", 10)
    log, calls = _run_daemon(roots, spec_dir, lease_s=120, STUB_FINISH="1")

    assert "SFT weights as expected (d1)" in log
    rl = calls[-1]
    assert rl["stages"] == ["rl", "bench"] and rl["found_checkpoints"] == ["checkpoint-5"]
    assert 60 <= rl["time_limit_s"] <= 70 and not (roots.checkpoint_in / "grpo-s1").exists()
    assert sorted(p.name for p in roots.out.iterdir()) == ["adapter.tgz", "runs.tgz"]
    with tarfile.open(roots.out / "adapter.tgz") as tar:
        assert tar.extractfile("./adapter_model.safetensors").read() == b"adapter"
    with tarfile.open(roots.out / "runs.tgz") as tar:
        assert "bench/grpo-s1/summary.json" in tar.getnames()
    assert "adapter sha256 " in log and roots.done.exists()


def test_daemon_goes_on_past_failures_and_always_writes_done(lease, tmp_path):
    spec = lease.Spec(run="r", resume=True, checkpoint_wait_s=0,
                      after=[lease.Timed("echo after-ran > {out}/after.txt", timeout_s=5)])
    roots, spec_dir = _machine(lease, tmp_path, spec)
    log, calls = _run_daemon(roots, spec_dir, lease_s=120)
    assert "NO CHECKPOINT" in log and [c["stages"] for c in calls] == [["splits", "mix"], ["base"], ["sft"]]
    assert (roots.out / "after.txt").read_text() == "after-ran\n" and roots.done.exists()

    spec = lease.Spec(run="r")
    roots, spec_dir = _machine(lease, tmp_path / "2", spec)
    (roots.repo / "mix.jsonl.gz").write_bytes(b"not gzip")
    log, calls = _run_daemon(roots, spec_dir, lease_s=120, STUB_SFT_RC="1")
    assert "mix FAILED" in log and "sft: rc 1" in log and (roots.out / "runs.tgz").exists() and roots.done.exists()
    assert [c["stages"] for c in calls] == [["base"], ["sft"]]  # no splits (the mix failed), no rl (sft failed)

    roots, spec_dir = _machine(lease, tmp_path / "3", lease.Spec(run="r"), gguf=False)
    log, calls = _run_daemon(roots, spec_dir, lease_s=120)
    assert "NO GGUF" in log and [c["stages"] for c in calls] == [["splits", "mix"]] and roots.done.exists()


# ------------------------------------------------------------------------------------------------- the calls

def test_calls_move_the_gguf_in_whole_and_the_watch_brings_back_out(lease, tmp_path, monkeypatch, capsys):
    """The calls of a plan in a temporary /tmp, the daemon really detached: the GGUF appears only with its last
    chunk, the checkpoint lands in ckin, and the last call's watch copies the results to $OUT at DONE."""
    tree = tmp_path / "tree"
    (tree / ".dev").mkdir(parents=True)
    for script in ("lease.py", "bundle.py"):
        shutil.copy(REPO / ".dev" / script, tree / ".dev" / script)
    (tree / ".whl").mkdir()
    bundle = load_script(".dev/bundle.py")
    model = tmp_path / "x.gguf"
    model.write_bytes(os.urandom(5000))
    gguf = bundle.pack(tree / ".carry" / "G", [str(model)], 4000)
    _sparse(tmp_path / "ck" / "r" / "checkpoint-3" / "trainer_state.json", 10)
    pieces = bundle.pack(tree / ".carry" / "ck", [str(tmp_path / "ck" / "r")], 6000)
    stub = tmp_path / "stub_miniature.py"
    stub.write_text(STUB)
    spec = lease.Spec(run="r", resume=True, gguf_name="x.gguf", gguf_wait_s=30, checkpoint_wait_s=30,
                      miniature=f"{sys.executable} {stub} --root {{mini}} --base {{gguf}}")
    monkeypatch.chdir(tree)
    plan = lease.make_plan(tree, Path("L"), gguf, pieces, Path(".whl"), 64, spec, tree=0)
    assert [len(c["gguf"]) for c in plan["calls"]] == [1, 1, 1]
    roots = lease.Roots(tmp_path / "tmp")
    out = tmp_path / "OUT"
    out.mkdir()
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setattr(lease, "WATCH_POLL_S", 0.2)

    lease.first_call(plan, "L", roots, lease_s=200, first_log_s=0.2)
    assert (roots.repo / "L" / "spec.json").exists() and (roots.repo / ".dev" / "lease.py").exists()
    assert not list((roots.repo / ".carry").rglob("bundle-*"))  # the chunks go to the stores, not the copy
    assert not (roots.state / "x.gguf").exists() and len(list(roots.gguf_store.iterdir())) == 1
    lease.run_call(Path("L"), 2, roots, lease_s=0, watch_s=None)
    assert not (roots.state / "x.gguf").exists() and not roots.done.exists()
    assert "not done yet" in capsys.readouterr().out
    lease.run_call(Path("L"), 3, roots, lease_s=0, watch_s=30)
    assert (roots.state / "x.gguf").read_bytes() == model.read_bytes()
    printed = capsys.readouterr().out
    assert "rl/r/metrics.jsonl: 2 steps; rewards [0.1, 0.5]" in printed
    assert roots.done.exists() and sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in roots.out.iterdir()) and (out / "runs.tgz").exists()
    calls = [json.loads(line) for line in (roots.mini / "stub_calls.jsonl").read_text().splitlines()]
    assert calls[-1]["found_checkpoints"] == ["checkpoint-3"]  # the pieces, unpacked into ckin, resumed
    assert _eventually(lambda: not roots.daemon_pid.exists(), 10)  # the daemon removes it after DONE


# ------------------------------------------------------------------------------------------------- stop, warm machine

def _runs(pid: int) -> bool:
    """Whether pid is a process that has not ended (a zombie has: nothing may reap it here)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _eventually(check, seconds: float) -> bool:
    end = time.time() + seconds
    while not check() and time.time() < end:
        time.sleep(0.05)
    return check()


@pytest.mark.parametrize("ignores_term", [False, True])
def test_stop_ends_a_detached_process_group(lease, tmp_path, capsys, ignores_term):
    """A shell and its child, started as the daemon is: both end, by the pid file, SIGKILL where SIGTERM does
    nothing."""
    roots = lease.Roots(tmp_path)
    roots.mini.mkdir()
    trap = "trap '' TERM; " if ignores_term else ""
    lease.launch_detached(["sh", "-c", f"{trap}sleep 60 & echo $! > child.pid; wait"], tmp_path / "log", tmp_path,
                          dict(os.environ), roots.daemon_pid)
    pid = int(roots.daemon_pid.read_text())
    assert _eventually(lambda: (tmp_path / "child.pid").exists() and (tmp_path / "child.pid").read_text().strip(), 10)
    child = int((tmp_path / "child.pid").read_text())
    assert _runs(pid) and _runs(child) and os.getpgid(child) == pid
    try:
        assert lease.main(["stop", "--root-tmp", str(tmp_path), "--grace-s", "0.5"]) == 0
    finally:
        for leftover in (pid, child):
            if _runs(leftover):
                os.kill(leftover, 9)
    how = "SIGKILL after 0.5 s" if ignores_term else "ended on SIGTERM"
    assert capsys.readouterr().out == f"stopped daemon {pid} (process group): {how}\n"
    assert not _runs(pid) and not _runs(child) and not roots.daemon_pid.exists()


def test_stop_without_a_daemon_says_so(lease, tmp_path, capsys):
    roots = lease.Roots(tmp_path)
    roots.mini.mkdir()
    assert lease.main(["stop", "--root-tmp", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("no daemon.pid (")
    ended = subprocess.Popen(["true"], start_new_session=True)
    ended.wait()
    roots.daemon_pid.write_text(f"{ended.pid}\n")
    assert lease.main(["stop", "--root-tmp", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"no daemon running (pid file stale: {ended.pid})\n"
    assert not roots.daemon_pid.exists()
    roots.daemon_pid.write_text("lease.py daemon\n")
    with pytest.raises(SystemExit, match="holds 'lease.py daemon', not a pid"):
        lease.main(["stop", "--root-tmp", str(tmp_path)])


def test_stop_ends_a_real_daemon_with_its_running_stage(lease, tmp_path, capsys):
    """The stage runs in a session of its own, out of the daemon's group: the daemon kills it as it stops, then
    packs, writes DONE and removes its pid file."""
    spec = lease.Spec(run="r", while_waiting=[lease.Timed("echo $$ > {mini}/stage.pid; exec sleep 60", 100)])
    roots, spec_dir = _machine(lease, tmp_path, spec)
    roots.mini.mkdir(parents=True)
    lease.launch_detached([sys.executable, str(REPO / ".dev" / "lease.py"), "daemon", str(spec_dir),
                           "--pack-by", str(time.time() + 200), "--root-tmp", str(roots.tmp)], roots.lease_log,
                          roots.repo, dict(os.environ), roots.daemon_pid)
    stage_pid = roots.mini / "stage.pid"
    try:
        assert _eventually(lambda: stage_pid.exists() and stage_pid.read_text().strip(), 30)
        stage = int(stage_pid.read_text())
        assert _runs(stage)
        assert lease.stop(roots, grace_s=20).endswith("ended on SIGTERM")
    finally:
        lease.stop(roots, grace_s=0)
    assert not _runs(stage) and roots.done.exists() and not roots.daemon_pid.exists()
    log = roots.lease_log.read_text()
    assert "stopped by signal 15" in log and "pack\n" in log and (roots.out / "runs.tgz").exists()


def _call_one(lease, tmp_path, monkeypatch):
    """Call 1's inputs with nothing to carry, and a launch that only records (and logs, as a daemon would)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    monkeypatch.chdir(tree)
    plan = {"wheels": ".whl", "calls": [{"gguf": [], "pieces": [], "completes": []}]}
    launched = []

    def launch(argv, log, cwd, env, pid_file):
        launched.append(argv)
        with open(log, "a") as f:
            f.write("this lease's daemon\n")

    return lease.Roots(tmp_path / "tmp"), plan, launch, launched


def test_first_call_refuses_while_an_earlier_daemon_runs(lease, tmp_path, monkeypatch):
    roots, plan, launch, launched = _call_one(lease, tmp_path, monkeypatch)
    roots.mini.mkdir(parents=True)
    earlier = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        roots.daemon_pid.write_text(f"{earlier.pid}\n")
        with pytest.raises(SystemExit, match=rf"still running on this warm machine \(pid {earlier.pid}\): "
                                             r"`python3 .dev/lease.py stop` first"):
            lease.first_call(plan, "L", roots, lease_s=100, launch=launch, first_log_s=0)
    finally:
        earlier.kill()
        earlier.wait()
    assert launched == [] and not roots.repo.exists()
    assert roots.daemon_pid.read_text() == f"{earlier.pid}\n"


def test_first_call_on_a_warm_machine_clears_the_earlier_lease(lease, tmp_path, monkeypatch, capsys):
    """The earlier lease's DONE would end this lease's watch at once, its out files would come back as this
    lease's, and its log would be printed as this daemon's first lines."""
    roots, plan, launch, launched = _call_one(lease, tmp_path, monkeypatch)
    (roots.out / "bundle-x").mkdir(parents=True)
    for path in (roots.out / "runs.tgz", roots.out / "bundle-x" / "part", roots.done):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("earlier")
    roots.lease_log.write_text("the earlier lease's daemon\n")
    lease.first_call(plan, "L", roots, lease_s=100, launch=launch, first_log_s=0)
    printed = capsys.readouterr().out
    assert len(launched) == 1 and not roots.done.exists() and list(roots.out.iterdir()) == []
    assert f"warm machine: an earlier lease's files lie under {roots.tmp}; stages that find their outputs skip them" \
        in printed
    assert f"removed from {roots.out}, the earlier lease's: bundle-x, runs.tgz\n" in printed
    assert "this lease's daemon" in printed and "the earlier lease's daemon" not in printed
