"""Reports of bench and training runs: Fast@p tables, per-turn curves, outcome breakdowns, distributions and
per-task results, beside other runs and published numbers, as Markdown, CSV, PNG and a self-contained HTML page.

Needs the `report` extra (matplotlib, Jinja2). Definitions of every number: docs/report.md.
"""

from drkernel.report.build import Report, write_report

__all__ = ["Report", "write_report"]
