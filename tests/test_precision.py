"""The precision rule (issue 26): the candidate's error and the reference's own, both against a float64 evaluation
of the reference, their ratio in the result and the feedback; `matched` refuses a speedup bought with lower
precision, `tolerance` judges by atol/rtol alone. The interpreter emulates float16 and bfloat16 by casting."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import drkernel
from drkernel.feedback import render
from drkernel.sandbox import correctness
from drkernel.schema import EvalOptions, Status

REPO = Path(__file__).resolve().parents[1]
FAST = {"perf_trials": 2, "warmup_trials": 1, "timeout_s": 90}
HALF_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(64, 64).half(), torch.randn(64, 64).half()]


def get_init_inputs():
    return []
'''


def _source(relative: str) -> str:
    return (REPO / relative).read_text()


def test_errors_against_float64_and_the_arithmetic_they_show() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    exact = a.double() @ b.double()
    ref = a @ b
    half = (a.half().float() @ b.half().float())
    cand_err, ref_err, dtype = correctness.errors_against(exact, ref, half)
    assert dtype == torch.float32 and 0 < ref_err < 1e-6 and 1e-4 < cand_err < 1e-2
    assert correctness.arithmetic_like(ref_err) == "float32"
    assert correctness.arithmetic_like(cand_err) == "tf32 or float16"
    assert correctness.arithmetic_like(3e-3) == "bfloat16"
    assert correctness.errors_against([exact.long()], [ref.long()], [ref.long()]) is None  # integers: no rule
    assert correctness.relative_error(torch.zeros(3), torch.zeros(3)) == 0.0


def test_options_validate_the_rule() -> None:
    with pytest.raises(ValueError, match="precision must be"):
        EvalOptions(precision="loose")
    with pytest.raises(ValueError, match="precision_factor"):
        EvalOptions(precision_factor=0.5)
    assert EvalOptions().precision == "matched"


@pytest.mark.slow
def test_half_inputs_are_refused_when_matched_and_accepted_by_tolerance() -> None:
    task = _source("examples/tasks/4_matmul_small.py")
    half = _source("tests/exploits/p1_fp16_inputs_matmul.py")
    # Its elementwise error (max 0.0102-0.0117 on the secret trials' inputs) straddles the default atol/rtol of 0.01:
    # at those, 2 of 9 evaluations failed a trial or a checked timed call. The precision rule is what is tested here,
    # so the elementwise tolerance is set wide enough for every draw.
    loose = {**FAST, "atol": 0.05, "rtol": 0.05}
    matched = drkernel.evaluate(task, half, **loose)
    tolerance = drkernel.evaluate(task, half, precision="tolerance", **loose)
    honest = drkernel.evaluate(task, _source("examples/candidates/4_matmul_small__triton.py"), **FAST)
    assert matched.status == Status.HACKED.value and matched.hack_reasons == ["precision_downcast"]
    assert "float16" in matched.hack_details["precision_downcast"]
    assert tolerance.status == Status.CORRECT.value, render(tolerance)
    for result in (matched, tolerance):
        q = result.correctness.precision
        assert q is not None and q.ratio > 100 and q.candidate_error > 1e-4
        assert "Precision: error against float64" in render(result)
    assert tolerance.correctness.precision.rule == "tolerance" and matched.correctness.precision.rule == "matched"
    q = honest.correctness.precision
    assert honest.status == Status.CORRECT.value and q.rule == "matched" and q.ratio <= q.factor


@pytest.mark.slow
def test_a_half_precision_reference_is_judged_against_its_own_error() -> None:
    """A float16 task: a candidate that computes in float32 and rounds once is more precise than the reference."""
    candidate = _source("examples/candidates/4_matmul_small__triton.py").replace(
        "C = torch.empty((M, N), device=A.device, dtype=torch.float32)",
        "A, B = A.float(), B.float()\n        C = torch.empty((M, N), device=A.device, dtype=torch.float32)").replace(
        "        return C", "        return C.half()")
    result = drkernel.evaluate(HALF_TASK, candidate, **FAST)
    q = result.correctness.precision
    assert result.status == Status.CORRECT.value, render(result)
    assert q.reference_error > 1e-4 and q.ratio <= 2.0  # measured against float16's own error, not float32's


def test_a_batch_slice_stands_for_the_whole_only_where_rows_are_separate() -> None:
    # Where a float64 evaluation of everything does not fit, the judge measures precision on a slice of the batch
    # (the 6.4 GB level-1 problems); the slice must give those rows of the whole, and both outputs are cut alike.
    x, w = torch.randn(64, 32, dtype=torch.float64).float(), torch.randn(32, 8)
    rows = correctness.batch_rows([x, w], x @ w, 0.25, lambda n: n - 1)
    assert rows == slice(48, 64)
    assert correctness.batch_rows([x, w], (x @ w).sum(0), 0.25, lambda n: 0) is None  # the output has no batch
    assert correctness.batch_rows([torch.tensor(3.0)], torch.ones(4), 0.5, lambda n: 0) is None
    cut = correctness.rows_of([x, w], rows, 64)
    assert cut[0].shape == (16, 32) and cut[1] is w  # the weight is not batched
    assert correctness.same_rows(torch.softmax(cut[0], -1), torch.softmax(x, -1), rows, 64)
    assert not correctness.same_rows(cut[0] - cut[0].mean(0), x - x.mean(0), rows, 64)  # a norm over the batch
    assert not correctness.same_rows(cut[0][:, :4], x, rows, 64)  # another shape

    from drkernel.sandbox.correctness_phase import Exact

    ref_out = torch.relu(x)
    half = ref_out.clone()
    half[rows] = half[rows].half().float()  # a downcast in the sliced rows
    exact = Exact(torch.relu(cut[0].double()), rows)
    for cand, downcast in ((ref_out.clone(), False), (half, True)):
        precision, finding = exact.judge(ref_out, cand, EvalOptions())
        assert precision is not None and (finding is not None and finding.code == "precision_downcast") is downcast


def test_a_large_evaluation_measures_precision_within_a_smaller_share_of_the_gpu(tmp_path, monkeypatch) -> None:
    """A large evaluation's inputs and reference outputs already hold several GiB: its float64 trial gets a
    sixty-fourth of the GPU (a slice of the batch beyond it), where an ordinary one keeps a quarter."""
    from types import SimpleNamespace

    from drkernel.sandbox.correctness_phase import CorrectnessPhase
    from drkernel.sandbox.gpu_policy import (
        LARGE_PRECISION_SHARE, SHARE_OF_MEMORY, GpuPolicy, MemoryClass, precision_budget,
    )
    from drkernel.sandbox.judge_context import JudgeContext
    from drkernel.sandbox.reference import Reference

    h100 = int(79.2 * 2**30)  # an H100's total_memory, about
    assert precision_budget(h100, large=False) == SHARE_OF_MEMORY * h100 == 0.25 * h100  # unchanged
    assert precision_budget(h100, large=True) == LARGE_PRECISION_SHARE * h100 == h100 / 64
    assert 1.2 < precision_budget(h100, large=True) / 2**30 < 1.3

    model = torch.nn.Softmax(dim=-1)
    x = torch.randn(64, 32)
    needed = 2 * 8 * (x.numel() + x.numel())  # float64 copies of the input and the output, and headroom
    gpu = SimpleNamespace(total_memory=4 * needed)  # a quarter of it fits the whole, a sixty-fourth does not
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: gpu)
    for large, rows in ((False, None), (True, 4)):
        policy = GpuPolicy(None, torch.device("cuda"), SimpleNamespace())  # type: ignore[arg-type]
        policy.memory = MemoryClass(large, False)
        context = JudgeContext(None, tmp_path, torch.device("cuda"), None, policy)  # type: ignore[arg-type]
        phase = CorrectnessPhase(context)
        reference = Reference(model, model, lambda: [x], [], torch.device("cpu"))
        notes: list[str] = []
        exact = phase._precision(reference, [x], model(x), False, torch.no_grad, notes)
        assert exact is not None and (None if exact.rows is None else exact.rows.stop - exact.rows.start) == rows
        assert bool(notes) is large
        assert all(note.startswith("precision: measured on rows") for note in notes)
