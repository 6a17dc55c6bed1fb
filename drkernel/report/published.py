"""Published numbers (a paper's table), shown beside measured runs and always labelled as not measured here.

A file (JSON, or YAML with PyYAML) holds `source`, `unit` ("percent" or "fraction") and `entries`, each with a
`label`, a `level` (or null for all levels) and any of the metrics in METRICS. The package ships the Dr. Kernel
paper's KernelBench Level 2 numbers (published/dr_kernel_paper.json).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from drkernel.errors import UsageError

PAPER = "dr_kernel_paper.json"
NOT_MEASURED = "published, not measured here"
# metric key -> (kind, p): kind "level" for the level table, "last" / "best" for the per-turn figure
METRICS: dict[str, tuple[str, float]] = {
    "correct": ("level", 0.0),
    "fast_1": ("level", 1.0),
    "fast_1_2": ("level", 1.2),
    "fast_1_5": ("level", 1.5),
    "fast_2": ("level", 2.0),
    "last_turn_fast_1": ("last", 1.0),
    "last_turn_fast_1_2": ("last", 1.2),
    "best_of_history_fast_1": ("best", 1.0),
    "best_of_history_fast_1_2": ("best", 1.2),
}


class PublishedError(UsageError):
    """A published-numbers file cannot be used; the message says why."""


@dataclass(frozen=True)
class Published:
    label: str
    source: str
    level: int | None
    values: dict[str, float]  # metric key -> fraction in [0, 1]

    @property
    def name(self) -> str:
        return f"{self.label} ({NOT_MEASURED})"

    def value(self, kind: str, p: float) -> float | None:
        return next((v for k, v in self.values.items() if METRICS[k] == (kind, p)), None)


def load_paper() -> list[Published]:
    """The numbers shipped with the package."""
    text = (resources.files("drkernel.report") / "published" / PAPER).read_text()
    return parse(json.loads(text), PAPER)


def load_published(path: str | Path) -> list[Published]:
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise PublishedError(f"cannot read {path}: {exc}") from exc
    if path.suffix in (".yaml", ".yml"):
        from drkernel.tasks.loaders import require

        yaml = require("yaml", "report", "reading a YAML file of published numbers")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise PublishedError(f"{path}: not YAML: {exc}") from exc
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PublishedError(f"{path}: not JSON: {exc}") from exc
    return parse(data, str(path))


def parse(data: Any, where: str) -> list[Published]:
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list) or not data["entries"]:
        raise PublishedError(f"{where}: expected an object with a non-empty list 'entries'")
    source = str(data.get("source", where))
    unit = data.get("unit", "percent")
    if unit not in ("percent", "fraction"):
        raise PublishedError(f"{where}: unit must be 'percent' or 'fraction', not {unit!r}")
    scale = 100.0 if unit == "percent" else 1.0
    entries = []
    for number, entry in enumerate(data["entries"], 1):
        if not isinstance(entry, dict) or not isinstance(entry.get("label"), str):
            raise PublishedError(f"{where}: entry {number} needs a string 'label'")
        level = entry.get("level")
        if level is not None and not isinstance(level, int):
            raise PublishedError(f"{where}: entry {number} ({entry['label']}): level must be an integer or null")
        values = {k: v for k, v in entry.items() if k not in ("label", "level")}
        unknown = sorted(set(values) - set(METRICS))
        if unknown:
            raise PublishedError(
                f"{where}: entry {number} ({entry['label']}): unknown metric(s) {', '.join(unknown)}; "
                f"known: {', '.join(METRICS)}"
            )
        for key, value in values.items():
            if not isinstance(value, (int, float)) or not 0 <= value <= scale:
                raise PublishedError(
                    f"{where}: entry {number} ({entry['label']}): {key} must be a number in [0, {scale:g}]"
                )
        entries.append(Published(entry["label"], source, level, {k: v / scale for k, v in values.items()}))
    return entries
