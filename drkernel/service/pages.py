"""The page of one evaluation, shared by the live dashboard (`drkernel serve`) and `drkernel report --serve`.

Rendering only, from the one result shape (`EvalResult`): Jinja2 templates with autoescape on, so a candidate's
source is always text, never HTML; Pygments' highlighting, which escapes every token before it wraps it in a span;
the plots as inline SVG drawn here, so the page needs no script and nothing from the network.
"""

from __future__ import annotations

import functools
import html
import math
from dataclasses import dataclass, field
from typing import Any

from drkernel.schema import EvalResult, Profile, Timing
from drkernel.tasks.loaders import require

PREFIX = "/dashboard"  # where the pages live, in the service and in the run browser alike
STATIC = f"{PREFIX}/static"
PLOT_WIDTH, ROW_HEIGHT, MARGIN = 640, 56, 96  # the timing plot: px wide, px per side, px of labels on the left


@dataclass
class EvaluationPage:
    """What one evaluation's page shows; `result` is None until there is one (queued, running, no code)."""

    title: str
    task: str
    reference_url: str | None
    source: str
    result: EvalResult | None = None
    facts: list[tuple[str, str]] = field(default_factory=list)  # (label, value): id, client, times
    state: str = "done"  # queued or running: the page reloads itself until the result is in

    @property
    def waiting(self) -> bool:
        return self.state in ("queued", "running")


@functools.cache
def environment() -> Any:
    jinja2 = require("jinja2", "serve", "the dashboard's pages")
    env = jinja2.Environment(loader=jinja2.PackageLoader("drkernel.service", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.globals.update(static=STATIC, prefix=PREFIX)
    env.filters["number"] = number
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


def evaluation_html(page: EvaluationPage) -> str:
    result = page.result
    return render(
        "evaluation.html.j2", page=page, result=result,
        reasons=[(r, (result.hack_details or {}).get(r, "")) for r in result.hack_reasons] if result else [],
        timing_plot=timing_svg(result.timing) if result and result.timing else None,
        coverage=coverage(result.profile) if result and result.profile else None,
        phases=phase_bars(result.phases_s) if result else [],
        code=highlight(page.source),
    )


def source_html(title: str, source: str, back_url: str) -> str:
    """A source file on its own page (a task's reference), highlighted."""
    return render("source.html.j2", title=title, code=highlight(source), back_url=back_url)


def highlight(source: str) -> Any:
    """Python highlighted as HTML spans; Pygments escapes each token's text, so `<script>` stays text."""
    markup = require("markupsafe", "serve", "the dashboard's pages").Markup
    pygments = require("pygments", "serve", "highlighting sources")
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    return markup(pygments.highlight(source, PythonLexer(), HtmlFormatter(nowrap=True)))


def number(value: Any, digits: int = 3) -> str:
    """A measurement as the page shows it: significant digits, '-' when there is none."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def coverage(profile: Profile) -> dict[str, Any]:
    """The profile's split of GPU time: the candidate's own kernels against the rest (shares of 100)."""
    own = profile.coverage
    return {"own": None if own is None else round(100 * own, 1),
            "rest": None if own is None else round(100 * (1 - own), 1), "profile": profile}


def phase_bars(phases: dict[str, float]) -> list[tuple[str, float, float]]:
    """(phase, seconds, share of the longest in percent), in the order the evaluation went through them."""
    longest = max(phases.values(), default=0.0)
    return [(name, seconds, 100 * seconds / longest if longest > 0 else 0.0) for name, seconds in phases.items()]


def timing_svg(timing: Timing) -> Any:
    """Every timed call of both sides as a dot on one axis (logarithmic when the sides lie a decade or more apart),
    with each side's median as a bar; None when no side kept its calls."""
    sides = [(name, stats.samples_ms, stats.median_ms) for name, stats in
             (("reference", timing.reference), ("candidate", timing.candidate)) if stats and stats.samples_ms]
    if not sides:
        return None
    values = [v for _, samples, _ in sides for v in samples if v > 0]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    logarithmic = low > 0 and high / low >= 10
    if logarithmic:
        low, high = low / 1.2, high * 1.2
    else:
        low, high = 0.0, high * 1.05 or 1.0
    span = PLOT_WIDTH - MARGIN - 16

    def x(value: float) -> float:
        if logarithmic:
            share = (math.log(max(value, low)) - math.log(low)) / (math.log(high) - math.log(low))
        else:
            share = (value - low) / (high - low)
        return MARGIN + span * min(max(share, 0.0), 1.0)

    height = ROW_HEIGHT * len(sides) + 44
    parts = [f'<svg class="timing-plot" role="img" viewBox="0 0 {PLOT_WIDTH} {height}" width="{PLOT_WIDTH}" '
             f'height="{height}" xmlns="http://www.w3.org/2000/svg">',
             f"<title>{'log-scale' if logarithmic else 'linear'} per-call times, ms</title>"]
    for row, (name, samples, median) in enumerate(sides):
        middle = ROW_HEIGHT * row + ROW_HEIGHT / 2 + 4
        parts.append(f'<text x="4" y="{middle + 4:.1f}" class="label">{html.escape(name)}</text>')
        parts += [f'<circle class="call {name}" cx="{x(v):.1f}" cy="{middle + ((i * 7) % 15) - 7:.1f}" r="3"/>'
                  for i, v in enumerate(samples)]
        parts.append(f'<line class="median" x1="{x(median):.1f}" x2="{x(median):.1f}" y1="{middle - 16:.1f}" '
                     f'y2="{middle + 16:.1f}"><title>median {number(median)} ms</title></line>')
    axis = ROW_HEIGHT * len(sides) + 8
    parts.append(f'<line class="axis" x1="{MARGIN}" x2="{MARGIN + span}" y1="{axis}" y2="{axis}"/>')
    for tick in _ticks(low, high, logarithmic):
        parts.append(f'<line class="axis" x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="{axis}" y2="{axis + 4}"/>'
                     f'<text x="{x(tick):.1f}" y="{axis + 18}" class="tick">{number(tick, 2)}</text>')
    parts.append(f'<text x="{MARGIN + span}" y="{axis + 30}" class="tick end">ms per call</text></svg>')
    return require("markupsafe", "serve", "the dashboard's pages").Markup("".join(parts))


def _ticks(low: float, high: float, logarithmic: bool) -> list[float]:
    """A few round values inside [low, high]: powers of ten on a log axis, steps of 1, 2 or 5 x 10^k otherwise."""
    if logarithmic:
        return [10.0 ** k for k in range(math.ceil(math.log10(low)), math.floor(math.log10(high)) + 1)]
    raw = (high - low) / 5
    step = min((m * 10 ** math.floor(math.log10(raw)) for m in (1, 2, 5, 10)), key=lambda s: abs(s - raw))
    return [round(step * k, 12) for k in range(math.ceil(low / step), math.floor(high / step) + 1)]
