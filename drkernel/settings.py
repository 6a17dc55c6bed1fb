"""Settings of configs that nest others (BenchConfig and TrainConfig hold `evaluation`, an EvalOptions, and
`engine`, an EngineConfig) as flat dotted keys and back: `--set evaluation.device=cpu`, a resumed run's saved
settings under the ones given again, and the older flat keys those configs had before they nested.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drkernel.errors import UsageError


def flatten(data: Mapping[str, Any], moved: Mapping[str, str] | None = None) -> dict[str, Any]:
    """{"engine": {"workers": 2}} -> {"engine.workers": 2}; an older flat key in `moved` (old key -> dotted key)
    becomes the key of the place its setting has now. A setting given under both its names is a UsageError."""
    flat: dict[str, Any] = {}
    for key, value in _dotted(data):
        new = (moved or {}).get(key, key)
        if new in flat:
            raise UsageError(f"{new} is given twice (also as {key})" if new != key else f"{key} is given twice")
        flat[new] = value
    return flat


def _dotted(data: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in data.items():
        items += _dotted(value, f"{prefix}{key}.") if isinstance(value, Mapping) else [(f"{prefix}{key}", value)]
    return items


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{"engine.workers": 2} -> {"engine": {"workers": 2}}."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        place = nested
        for parent in parents:
            place = place.setdefault(parent, {})
            if not isinstance(place, dict):
                raise UsageError(f"{parent} is a group of settings, not a value")
        place[leaf] = value
    return nested
