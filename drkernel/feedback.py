"""Render a result as compact text: for a person at the terminal, and for a model's next turn.

A failure always carries its error text, with the traceback cut to the candidate's own frames and the final
exception; a hack always carries the reasons and what to do instead.
"""

from __future__ import annotations

from typing import Any

from drkernel.schema import EvalResult, Status

TRACEBACK_LINES = 12
TOP_KERNELS = 5


def render(result: EvalResult | dict[str, Any], max_chars: int = 4000) -> str:
    if isinstance(result, dict):
        result = EvalResult.from_dict(result)
    lines = [_headline(result)]
    c = result.correctness
    if c is not None and c.trials:
        detail = f"Correctness: {c.passed_trials}/{c.trials} trials passed"
        if c.max_abs_diff is not None:
            detail += f", max abs diff {c.max_abs_diff:.3g}, relative error {c.rel_error or 0:.3g}"
        if c.atol is not None:
            detail += f" (atol {c.atol:g}, rtol {c.rtol:g}, relative bound {c.rel_error_bound:g})"
        lines.append(detail)
        if c.precision is not None:
            q = c.precision
            lines.append(
                f"Precision: error against float64 {q.candidate_error:.2g}, the reference's own {q.reference_error:.2g}"
                f" (ratio {q.ratio:.3g}; rule {q.rule}" + (f", at most {q.factor:g}" if q.rule == "matched" else "")
                + ")")
    for code in result.hack_reasons:
        lines.append(f"Hack [{code}]: {result.hack_details.get(code, '')}".rstrip())
    if result.error is not None:
        lines.append(f"Error ({result.error.kind}): {result.error.message}")
        tb = relevant_traceback(result.error.traceback)
        if tb:
            lines.append(tb)
    t = result.timing
    if t is not None and t.reference is not None and t.candidate is not None:
        lines.append(
            f"Timing: reference {t.reference.median_ms:.4g} ms ({t.reference_mode}), candidate "
            f"{t.candidate.median_ms:.4g} ms; median of {t.candidate.trials} trials, IQR "
            f"{t.candidate.iqr_ms:.3g} ms, {t.candidate.method}"
        )
        if t.note:
            lines.append(f"Note: {t.note}")
    p = result.profile
    if p is not None:
        if p.meaningful and p.kernels:
            lines.append("Top GPU kernels: " + "; ".join(
                f"{k.name} {k.gpu_time_us:.1f} us x{k.calls}{' (own)' if k.own else ''}"
                for k in p.kernels[:TOP_KERNELS]))
        elif p.launches:
            lines.append("Triton launches: " + ", ".join(f"{n} x{c}" for n, c in p.launches.items()))
    lines += [f"Note: {n}" for n in result.notes]
    text = "\n".join(lines)
    return text if len(text) <= max_chars else text[: max_chars - 4] + " ..."


def _headline(result: EvalResult) -> str:
    parts = [f"Verdict: {result.status.upper()}"]
    if result.speedup is not None and result.status == Status.CORRECT:
        speed = f"speedup {result.speedup:.3g}x"
        if result.speedup_ci:
            speed += f" (95% CI {result.speedup_ci[0]:.3g}-{result.speedup_ci[1]:.3g})"
        parts.append(speed)
    if result.profile is not None and result.profile.meaningful and result.profile.coverage is not None:
        parts.append(f"Triton coverage {result.profile.coverage:.0%}")
    return " | ".join(parts)


def relevant_traceback(traceback: str) -> str:
    """Keep the candidate's own frames and the final exception lines; drop the harness's and libraries' frames."""
    lines = traceback.rstrip().splitlines()
    if len(lines) <= TRACEBACK_LINES:
        return "\n".join(lines)
    keep: list[str] = []
    for i, line in enumerate(lines):
        if line.lstrip().startswith('File "candidate.py"'):
            keep += lines[i: i + 2]
    tail = []
    for line in reversed(lines):  # the exception itself: everything after the last frame's code line
        if line.startswith("  "):
            break
        tail.insert(0, line)
    return "\n".join(keep[-TRACEBACK_LINES:] + tail[-TRACEBACK_LINES:])
