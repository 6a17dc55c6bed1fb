"""The synthetic task family: deterministic, split by structure, valid tasks, and reference solutions whose
verdicts match their grades under the CPU interpreter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from drkernel.schema import EvalOptions, EvalRequest
from drkernel.tasks import load_candidates, load_tasks, pair_candidates
from drkernel.tasks.synthetic import (
    COLS,
    ELEMENTWISE_OPS,
    KINDS,
    MATMUL_K,
    MATMUL_MN,
    MIN_DIM,
    NORMALISING,
    ROWS,
    SPLITS,
    VECTOR_OPS,
    Structure,
    SyntheticError,
    generate,
    generate_tasks,
    torch_lines,
)
from drkernel.tasks.synthetic_solutions import GOOD_VARIANTS, VARIANTS, solution_source, solutions, variants_for

TINY = 1 / 256


def test_generation_is_deterministic_and_prefix_stable() -> None:
    first = generate_tasks("train", 30, seed=3, shape_scale=TINY)
    assert first == generate_tasks("train", 30, seed=3, shape_scale=TINY)
    assert generate_tasks("train", 12, seed=3, shape_scale=TINY) == first[:12]
    other = generate_tasks("train", 30, seed=4, shape_scale=TINY)
    assert [t.name for t in other] != [t.name for t in first]


def test_splits_are_disjoint_by_structure_whatever_the_seed() -> None:
    keys = {split: set() for split in SPLITS}
    for seed in (0, 1):
        for split, n in (("train", 200), ("validation", 40), ("test", 60)):
            tasks = generate(split, n, seed=seed)
            assert all(t.split == split and t.structure.split == split for t in tasks)
            keys[split] |= {t.structure.key for t in tasks}
    assert not keys["train"] & keys["test"]
    assert not keys["train"] & keys["validation"]
    assert not keys["validation"] & keys["test"]
    # A reordered chain keeps its split: the key is the multiset of ops.
    a = Structure("elementwise", prologue=("relu", "add_bias", "tanh"))
    b = Structure("elementwise", prologue=("tanh", "relu", "add_bias"))
    assert a.key == b.key == "elementwise:add_bias,relu,tanh" and a.split == b.split


def test_tasks_are_valid_kernelbench_sources_with_distinct_chains() -> None:
    synthetic = generate("test", 40, seed=0, level=7)
    tasks = [s.task() for s in synthetic]
    for task in tasks:
        task.check()
        assert task.level == 7 and task.key == f"L7/{task.name}"
    assert [t.problem_id for t in tasks] == list(range(1, 41))
    assert len({t.name for t in tasks}) == 40
    assert len({(s.structure.kind, *s.structure.steps) for s in synthetic}) == 40
    assert [s.structure.kind for s in synthetic[:8]] == list(KINDS) * 2
    for s in synthetic:
        assert sum(op in VECTOR_OPS for op in s.structure.steps) == 1
        assert s.name.startswith(f"{s.index}_{s.structure.kind}_")
    first = tasks[0]
    assert first.name == "1_elementwise_leaky_relu_abs_mul_gain_sigmoid"
    assert "v = F.leaky_relu(v, 0.1)\n        v = torch.abs(v)\n        v = v * vec\n" in first.code


def test_shapes_are_gpu_sized_and_scale_down_to_at_least_min_dim() -> None:
    for s in generate("train", 40, seed=0):
        if s.structure.kind == "matmul":
            assert (s.shape.rows in MATMUL_MN and s.shape.cols in MATMUL_MN and s.shape.inner in MATMUL_K)
        else:
            assert s.shape.rows in ROWS and s.shape.cols in COLS and s.shape.inner is None
    tiny = generate("train", 40, seed=0, shape_scale=TINY)
    assert {s.structure for s in tiny} == {s.structure for s in generate("train", 40, seed=0)}
    dims = [d for s in tiny for d in (s.shape.rows, s.shape.cols, s.shape.inner) if d is not None]
    assert min(dims) == MIN_DIM and max(dims) == 32


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("dev", 3), "unknown split 'dev'; splits: train, validation, test"),
        (("test", 0), "n must be at least 1, not 0"),
        (("test", 3, 0, 0.0), "shape_scale must be positive, not 0.0"),
        (("validation", 10**6), "distinct validation chains of 1000000 asked for"),
    ],
)
def test_bad_requests_say_what_is_wrong(args: tuple, message: str) -> None:
    with pytest.raises(SyntheticError, match=message.replace("(", r"\(").replace(")", r"\)")):
        generate(*args)


def test_solutions_are_self_contained_modelnew_modules() -> None:
    for s in generate("validation", 12, seed=0, shape_scale=TINY):
        sources = solutions(s)
        expected = [v for v in VARIANTS if v != "wrong_norm" or s.structure.core in NORMALISING]
        assert list(sources) == expected == list(variants_for(s.structure))
        for variant, code in sources.items():
            tree = ast.parse(code)
            imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
            assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
            assert {name.split(".")[0] for name in imported} == {"torch", "triton"}, variant
            assert [n.name for n in tree.body if isinstance(n, ast.ClassDef)] == ["ModelNew"]
            kernels = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
            if variant == "unfused":
                assert kernels == [f"k{i}_{op}" for i, op in enumerate(s.structure.steps)]
            elif variant == "partial":
                assert kernels == [f"{next(op for op in s.structure.ops if op in VECTOR_OPS)}_kernel"]
            else:
                assert kernels == (["copy_kernel"] if variant == "lazy" else ["fused_kernel"])
            assert "expected" not in code and variant not in code.replace("fused_kernel", "")
    with pytest.raises(SyntheticError, match="has no variant 'wrong_norm'"):
        solution_source(generate("test", 1, seed=0)[0], "wrong_norm")


def test_partial_leaves_the_chain_to_pytorch_but_its_vector_op() -> None:
    """The core (norm, reduction, matmul) and every other op stay eager PyTorch, in the reference's order; the
    vector op alone is a Triton kernel's, over the whole (M, N) intermediate."""
    for s in generate("train", 8, seed=0):
        code = solution_source(s, "partial")
        vector = next(op for op in s.structure.ops if op in VECTOR_OPS)
        eager = [line for line in torch_lines(s.structure) if "vec" not in line]
        forward = [line.strip() for line in code.split("def forward")[1].splitlines()]
        assert [line for line in forward if line in eager] == eager
        launch = forward.index(f"{vector}_kernel[(rows,)](v, vec, out, n_cols, BLOCK_N=block, num_warps=warps)")
        assert forward[launch - 5] == eager[s.structure.ops.index(vector)]  # right after the op before it
        assert f"v = {ELEMENTWISE_OPS[vector][1]}" in code.split("class ModelNew")[0]


def test_wrong_variants_differ_from_the_fused_one_where_their_bug_is() -> None:
    norm = next(s for s in generate("test", 80, seed=0) if s.structure.core == "softmax")
    fused = solution_source(norm, "fused")
    assert solution_source(norm, "wrong_mask") == fused.replace("mask = cols < n_cols\n", "mask = cols < n_cols - n_cols // 4\n")
    assert solution_source(norm, "wrong_norm") == fused.replace("    v = v / tl.sum(v, axis=0)\n", "")
    last = ELEMENTWISE_OPS[norm.structure.epilogue[-1]][1]
    assert last != "tl.sigmoid(v)"
    wrong_op = fused.replace(f"    v = {last}\n    tl.store", "    v = tl.sigmoid(v)\n    tl.store")
    assert solution_source(norm, "wrong_op") == wrong_op != fused


def run_synth(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "drkernel.cli.main", "synth", *args],
                          capture_output=True, text=True, timeout=120)


def test_synth_command_writes_what_the_loaders_read(tmp_path: Path) -> None:
    proc = run_synth("--split", "validation", "--n", "5", "--shape-scale", str(TINY), "--out", str(tmp_path / "f"))
    assert proc.returncode == 0, proc.stderr
    tasks, candidates = load_tasks(tmp_path / "f" / "tasks"), load_candidates(tmp_path / "f" / "solutions")
    assert [t.name for t in tasks] == [s.name for s in generate("validation", 5, shape_scale=TINY)]
    pairs = pair_candidates(tasks, candidates)
    assert len(pairs) == len(candidates) == sum(len(solutions(s)) for s in generate("validation", 5))
    manifest = json.loads((tmp_path / "f" / "manifest.json").read_text())
    assert manifest["split"] == "validation" and len(manifest["tasks"]) == 5

    proc = run_synth("--n", "3", "--level", "2", "--format", "jsonl", "--variants", "fused,lazy",
                     "--out", str(tmp_path / "j"))
    assert proc.returncode == 0, proc.stderr
    tasks, candidates = load_tasks(tmp_path / "j" / "tasks.jsonl"), load_candidates(tmp_path / "j" / "solutions.jsonl")
    pairs = pair_candidates(tasks, candidates)
    assert [c.id for _, c in pairs][:2] == [f"{tasks[0].key}__fused", f"{tasks[0].key}__lazy"]
    assert len(pairs) == 6 and tasks[0].key.startswith("L2/1_")

    again = run_synth("--n", "3", "--format", "jsonl", "--out", str(tmp_path / "j"))
    assert again.returncode == 2 and "already exist" in again.stderr
    bare = run_synth("--n", "2", "--variants", "", "--out", str(tmp_path / "bare"))
    assert bare.returncode == 0 and "wrote 2 test tasks and 0 solutions" in bare.stderr
    assert sorted(p.name for p in (tmp_path / "bare").iterdir()) == ["manifest.json", "tasks"]
    bad = run_synth("--variants", "fused,fast", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "unknown variant(s) fast" in bad.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_reference_solutions_get_the_verdicts_of_their_grades() -> None:
    """One task of each kind through the Scheduler on the CPU: fused, unfused, partial and lazy are correct
    (coverage, which calls lazy ones lazy and puts partial ones between, needs a GPU: here only launch counts), the
    wrong ones incorrect."""
    from drkernel.scheduling.scheduler import Scheduler

    sample = generate("test", len(KINDS), seed=0, shape_scale=TINY)
    options = EvalOptions(device="cpu", correctness_trials=1, measure_performance=False, timeout_s=120)
    labels, requests = [], []
    for s in sample:
        for variant, code in solutions(s).items():
            labels.append((s, variant))
            requests.append(EvalRequest(s.task().code, code, options, task_name=s.name))
    with Scheduler("cpu", workers=1) as scheduler:
        results = scheduler.evaluate_many(requests)
    verdicts = {(s.name, variant): r.status for (s, variant), r in zip(labels, results)}
    expected = {(s.name, v): "correct" if v in GOOD_VARIANTS else "incorrect" for s, v in labels}
    assert verdicts == expected
    for (s, variant), result in zip(labels, results):
        if variant not in GOOD_VARIANTS:
            assert result.error.kind == "Mismatch"
            continue
        trials = result.correctness.trials
        assert result.profile.coverage is None and not result.profile.meaningful
        if variant == "fused":
            assert result.profile.launches == {"fused_kernel": trials}
        elif variant == "lazy":
            assert result.profile.launches == {"copy_kernel": trials}
        elif variant == "partial":
            vector = next(op for op in s.structure.ops if op in VECTOR_OPS)
            assert result.profile.launches == {f"{vector}_kernel": trials}
        else:
            assert result.profile.launches == {f"k{i}_{op}": trials for i, op in enumerate(s.structure.steps)}


@pytest.mark.slow
def test_calibration_section_tables_verdicts_by_kind_and_variant(tmp_path: Path, monkeypatch) -> None:
    """benchmarks/gpu_bench.py's `synthetic` section (stage 0 of docs/miniature.md), on the CPU with one task."""
    from tests.scripts import load_script

    gpu_bench = load_script("benchmarks/gpu_bench.py")
    monkeypatch.setenv("DRKERNEL_TRITON_CACHE", str(tmp_path / "cache"))  # the section sets a fresh one
    task = generate("test", 1, seed=0, shape_scale=TINY)
    options = EvalOptions(device="cpu", correctness_trials=1, measure_performance=False, timeout_s=120)
    data = gpu_bench.synthetic_calibration(task, options, workers=1)
    assert data["evaluations"] == 6 and len(data["rows"]) == 6
    table = data["by_kind_and_variant"]
    assert list(table) == [f"elementwise/{v}" for v in sorted(variants_for(task[0].structure))]
    assert table["elementwise/lazy"]["statuses"] == {"correct": 1}
    assert table["elementwise/wrong_op"]["statuses"] == {"incorrect": 1}
    assert table["elementwise/fused"]["median_speedup"] is None and table["elementwise/fused"]["fast_1_2"] == 0.0
