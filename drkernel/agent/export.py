"""Cold-start SFT data from a run: each kept turn as one conversation (what the model saw, then its answer).

The paper made its cold-start set this way: multi-turn trajectories from a strong model, filtered for turns that
are correct and fast. Rows are `{"messages": [...]}` in chat format, which `datasets.load_dataset("json", ...)`
reads and TRL's SFTTrainer trains on as conversational data.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drkernel.agent.records import TurnRecord
from drkernel.schema import Status


@dataclass(frozen=True)
class SftFilter:
    """Which turns are kept: by default correct (so never hacked) with speedup >= 1."""

    require_correct: bool = True
    min_speedup: float | None = 1.0  # None keeps a turn whatever its speed (also when speed was not measured)

    def keeps(self, record: TurnRecord) -> bool:
        if record.code is None or record.result is None:
            return False
        if record.result.get("hack_reasons") or record.status == Status.HACKED:
            return False
        if self.require_correct and not record.correct:
            return False
        if self.min_speedup is not None:
            return record.speedup is not None and record.speedup >= self.min_speedup
        return True


def sft_rows(records: Iterable[TurnRecord], rule: SftFilter = SftFilter()) -> list[dict[str, Any]]:
    return [
        {"messages": [*record.messages, {"role": "assistant", "content": record.response}]}
        for record in records
        if rule.keeps(record)
    ]


def write_sft(records: Iterable[TurnRecord], out: str | Path, rule: SftFilter = SftFilter()) -> int:
    """Write the kept turns as JSONL; returns how many rows were written."""
    rows = sft_rows(records, rule)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return len(rows)
