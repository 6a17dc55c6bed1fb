"""Model selection on the validation split, the packing of the selected adapters with their digests, and the run
record of a training run (drkernel.train.selection, drkernel.train.pack, drkernel.train.run_record)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from drkernel.train.pack import main as pack_main
from drkernel.train.run_record import RUN_RECORD, tree_commit, write_run_record
from drkernel.train.selection import SelectionError, select_policy, validation_scores


def _run(folder: Path, scores: dict[int, float], saved: tuple[int, ...] | None = None, final: bool = True) -> Path:
    """A run folder as drkernel train leaves it: metrics.jsonl with validations at `scores`' steps, the policies
    of `saved` steps (all by default) and final/."""
    lines = [{"step": step, **({"validation": {"fast_1_2": scores[step]}} if step in scores else {})}
             for step in range(1, max(scores, default=1) + 1)]
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    for step in scores if saved is None else saved:
        policy = folder / "validation" / f"step_{step}" / "policy"
        policy.mkdir(parents=True)
        (policy / "adapter_model.safetensors").write_bytes(f"weights of step {step}".encode())
        base = str(folder.parent / "sft-s1" / "final")
        (policy / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))
    if final:
        (folder / "final").mkdir()
    return folder


def test_the_best_validation_wins_and_a_tie_goes_to_the_later_step(tmp_path):
    run = _run(tmp_path / "a", {10: 0.25, 20: 0.5, 30: 0.375})
    chosen = select_policy(run)
    assert (chosen.step, chosen.score, chosen.policy) == (20, 0.5, run / "validation" / "step_20" / "policy")
    tie = select_policy(_run(tmp_path / "b", {10: 0.5, 20: 0.25, 30: 0.5}))
    assert tie.step == 30
    # a validation whose policy was not saved (a run made before policies were kept) is no candidate
    assert validation_scores(_run(tmp_path / "c", {10: 0.75, 20: 0.25}, saved=(20,))) == {20: 0.25}
    # no validation: the final policy; nothing at all: an error
    assert select_policy(_run(tmp_path / "d", {})).policy == tmp_path / "d" / "final"
    with pytest.raises(SelectionError, match="no validated policy"):
        select_policy(_run(tmp_path / "e", {}, final=False))


def test_pack_copies_each_selected_policy_with_its_digests(tmp_path, capsys):
    runs = tmp_path / "rl"
    first = _run(runs / "recipe-s1", {10: 0.25, 20: 0.5})
    second = _run(runs / "grpo-s1", {10: 0.5})
    (tmp_path / "rl" / "sft-s1").mkdir()
    write_run_record(first, "rl", 1, {"seed": 1})
    sft = runs / "sft-s1"
    (sft / "sft_summary.json").write_text(json.dumps({"weights_sha256": "ab" * 32}))
    assert pack_main([str(first), str(second), "--out", str(tmp_path / "pack")]) == 0
    assert "2 policies" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "pack" / "manifest.json").read_text())
    recipe, grpo = manifest["policies"]
    assert (recipe["name"], recipe["step"], recipe["seed"]) == ("recipe-s1", 20, 1)
    assert (grpo["step"], grpo["seed"]) == (10, None)
    weights = tmp_path / "pack" / "recipe-s1" / "adapter_model.safetensors"
    assert weights.read_bytes() == b"weights of step 20"
    assert recipe["files"]["adapter_model.safetensors"] == {
        "bytes": len(b"weights of step 20"), "sha256": hashlib.sha256(b"weights of step 20").hexdigest()}
    assert recipe["base"] == {"path": str(sft / "final"), "weights_sha256": "ab" * 32}
    assert manifest["bytes"] == recipe["bytes"] + grpo["bytes"] and recipe["commits"] == [tree_commit()]
    with pytest.raises(SystemExit):  # two runs of one name would overwrite each other
        pack_main([str(first), str(tmp_path / "other" / "recipe-s1"), "--out", str(tmp_path / "pack2")])


def test_the_run_record_keeps_every_start_s_commit(tmp_path, monkeypatch):
    monkeypatch.delenv("DRKERNEL_COMMIT", raising=False)
    described = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                               cwd=Path(__file__).resolve().parent)
    assert tree_commit() == (described.stdout.strip() if described.returncode == 0 else "unknown")
    write_run_record(tmp_path, "rl", 3, {"seed": 3, "lora_rank": 8})
    monkeypatch.setenv("DRKERNEL_COMMIT", "abc1234")  # a copied tree without .git
    record = write_run_record(tmp_path, "rl", 3, {"seed": 3, "lora_rank": 8}, resumed=True)
    assert record == json.loads((tmp_path / RUN_RECORD).read_text())
    assert (record["kind"], record["seed"], record["config"]["lora_rank"]) == ("rl", 3, 8)
    first = described.stdout.strip() if described.returncode == 0 else "unknown"
    assert [(start["commit"], start["resumed"]) for start in record["starts"]] == [(first, False), ("abc1234", True)]
    assert "torch" in record["starts"][0]["versions"]
    # a fresh start (not a resume) begins the record again
    assert len(write_run_record(tmp_path, "rl", 3, {})["starts"]) == 1
