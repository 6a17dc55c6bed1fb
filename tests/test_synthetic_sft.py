"""The cold-start SFT mix of the miniature reproduction: exact proportions, the agent's chat format, and two-turn
examples judged by the real agent loop."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from drkernel.agent.parsing import extract_code
from drkernel.agent.prompts import first_turn_prompt
from drkernel.tasks.synthetic_solutions import solution_source
from drkernel.train.synthetic_sft import SftMixConfig, assign, build_sft_mix, mix_tasks, single_turn_rows

TINY = 1 / 256


def test_assign_gives_exact_proportions_in_a_seeded_order() -> None:
    shares = (("unfused", 0.5), ("lazy", 0.35), ("fused", 0.15))
    chosen = assign(20, shares, random.Random(1))
    assert sorted(chosen) == sorted(["unfused"] * 10 + ["lazy"] * 7 + ["fused"] * 3)
    assert chosen == assign(20, shares, random.Random(1)) != assign(20, shares, random.Random(2))
    assert sorted(assign(3, shares, random.Random(0))) == ["lazy", "unfused", "unfused"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"n_tasks": 0}, "n_tasks must be at least 1"),
        ({"single_turn": (("fused", 1.0), ("wrong_op", 1.0))}, "single_turn takes fused, unfused and lazy"),
        ({"single_turn": (("fused", 0.0),)}, "single_turn shares must be non-negative with a positive sum"),
        ({"second_turn": (("lazy", 1.0),)}, "second_turn cannot use lazy"),
    ],
)
def test_bad_mix_configs_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SftMixConfig(**fields)


def test_single_turn_rows_are_first_prompts_answered_by_reference_solutions() -> None:
    config = SftMixConfig(n_tasks=20, multi_turn_tasks=5, shape_scale=TINY)
    single, multi = mix_tasks(config)
    assert len(single) == 20 and len(multi) == 5 and not {t.name for t in single} & {t.name for t in multi}
    rows, counts = single_turn_rows(config)
    assert dict(counts) == {"unfused": 10, "lazy": 7, "fused": 3}
    for task, row in zip(single, rows):
        user, answer = row["messages"]
        assert user == {"role": "user", "content": first_turn_prompt(task.task().code)}
        code = extract_code(answer["content"])
        assert answer["role"] == "assistant" and code is not None
        assert [v for v in ("unfused", "lazy", "fused") if code.strip() == solution_source(task, v).strip()]


@pytest.mark.slow
def test_mix_holds_two_turn_examples_judged_by_the_agent_loop(tmp_path: Path) -> None:
    from drkernel.agent.records import read_trajectories

    config = SftMixConfig(n_tasks=4, multi_turn_tasks=2, shape_scale=TINY)
    summary = build_sft_mix(config, tmp_path, device="cpu")
    assert summary["single_turn"] == {"unfused": 2, "lazy": 1, "fused": 1}
    assert summary["multi_turn_kept"] == 2 and summary["rows"] == 6
    rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    multi = [row["messages"] for row in rows if len(row["messages"]) == 4]
    assert len(multi) == 2 and len(rows) == 6
    for messages in multi:
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
        assert messages[2]["content"].startswith("Your kernel was evaluated:\n\nVerdict: INCORRECT")
    records = read_trajectories(tmp_path / "multi_turn_run")
    assert sorted((r.turn, r.status) for r in records) == [(1, "incorrect")] * 2 + [(2, "correct")] * 2
    with pytest.raises(FileExistsError, match="sft.jsonl already exists"):
        build_sft_mix(config, tmp_path, device="cpu")
