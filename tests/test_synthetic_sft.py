"""The cold-start SFT mix of the miniature reproduction: exact proportions, the agent's chat format, and two-turn
examples judged by the real agent loop."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from drkernel.agent.parsing import extract_code
from drkernel.agent.prompts import first_turn_prompt
from drkernel.tasks.synthetic_solutions import GOOD_VARIANTS, solution_source, variants_for
from drkernel.train.synthetic_sft import (
    SftMixConfig,
    assign,
    build_sft_mix,
    main,
    mix_tasks,
    multi_turn_script,
    parse_shares,
    single_turn_rows,
)

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
        ({"single_turn": (("fused", 1.0), ("wrong_op", 1.0))}, "single_turn takes fused, unfused, partial, lazy"),
        ({"single_turn": (("fused", 0.0),)}, "single_turn shares must be non-negative with a positive sum"),
        ({"first_turn": (("wrong_op", 1.0),)},
         "first_turn takes lazy, partial, wrong, unfused, fused, each once; got wrong_op"),
        ({"first_turn": (("lazy", 0.5), ("lazy", 0.5))},
         "first_turn takes lazy, partial, wrong, unfused, fused, each once"),
    ],
)
def test_bad_mix_configs_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SftMixConfig(**fields)


def test_shares_are_read_from_the_command_line(tmp_path: Path, capsys) -> None:
    assert parse_shares("partial=0.5, lazy=0.25,unfused=0.25") == (("partial", 0.5), ("lazy", 0.25), ("unfused", 0.25))
    with pytest.raises(ValueError, match="expected NAME=SHARE, not 'lazy'"):
        parse_shares("partial=0.5,lazy")
    main(["--out", str(tmp_path / "mix"), "--n-tasks", "4", "--multi-turn-tasks", "0", "--shape-scale", str(TINY),
          "--single-turn", "lazy=1,fused=1"])
    assert json.loads(capsys.readouterr().out)["single_turn"] == {"lazy": 2, "fused": 2}
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "bad"), "--first-turn", "wrong_mask=1"])
    assert "first_turn takes lazy, partial, wrong, unfused, fused" in capsys.readouterr().err


def test_single_turn_rows_are_first_prompts_answered_by_reference_solutions() -> None:
    config = SftMixConfig(n_tasks=20, multi_turn_tasks=5, shape_scale=TINY)
    single, multi = mix_tasks(config)
    assert len(single) == 20 and len(multi) == 5 and not {t.name for t in single} & {t.name for t in multi}
    rows, counts = single_turn_rows(config)
    assert dict(counts) == {"partial": 8, "lazy": 6, "unfused": 4, "fused": 2}  # mostly not fused
    for task, row in zip(single, rows):
        user, answer = row["messages"]
        assert user == {"role": "user", "content": first_turn_prompt(task.task().code)}
        code = extract_code(answer["content"])
        assert answer["role"] == "assistant" and code is not None
        assert [v for v in GOOD_VARIANTS if code.strip() == solution_source(task, v).strip()]


def test_two_turn_rows_can_start_from_a_correct_answer() -> None:
    """unfused -> fused (a slow correct kernel made fast) and fused -> fused (a fast one kept after its feedback): the
    rows the first RL policies' mix lacked, asked for by share like the others."""
    config = SftMixConfig(n_tasks=1, multi_turn_tasks=4, shape_scale=TINY,
                          first_turn=(("unfused", 0.5), ("fused", 0.5)))
    _, tasks = mix_tasks(config)
    script, firsts = multi_turn_script(tasks, config)
    assert dict(firsts) == {"unfused": 2, "fused": 2}
    kinds = []
    for task in tasks:
        first, second = (extract_code(script.reply(task.name, 0, turn).content).strip() for turn in (1, 2))
        assert second == solution_source(task, "fused").strip()
        kinds.append(next(v for v in ("unfused", "fused") if solution_source(task, v).strip() == first))
    assert sorted(kinds) == ["fused", "fused", "unfused", "unfused"]


@pytest.mark.slow
def test_mix_holds_two_turn_examples_judged_by_the_agent_loop(tmp_path: Path) -> None:
    """lazy -> fused, partial -> fused and wrong -> fixed, each judged by the agent loop: the feedback between the
    answers is the judge's (on the CPU, coverage is not measured, so lazy and partial answers pass), and the
    answer after it is the fused code."""
    from drkernel.agent.records import read_trajectories

    config = SftMixConfig(n_tasks=4, multi_turn_tasks=3, shape_scale=TINY)
    summary = build_sft_mix(config, tmp_path, device="cpu")
    assert summary["single_turn"] == {"partial": 2, "lazy": 1, "unfused": 1}
    assert summary["first_turn"] == {"lazy": 1, "partial": 1, "wrong": 1}
    assert summary["multi_turn_kept"] == 3 and summary["rows"] == 7
    rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    multi = {row["messages"][0]["content"]: row["messages"] for row in rows if len(row["messages"]) == 4}
    _, tasks = mix_tasks(config)
    records = {(r.task, r.turn): r for r in read_trajectories(tmp_path / "multi_turn_run")}
    firsts = []
    for task in tasks:
        messages = multi[first_turn_prompt(task.task().code)]
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
        first = extract_code(messages[1]["content"]).strip()
        firsts.append(next(v for v in variants_for(task.structure) if solution_source(task, v).strip() == first))
        verdict = "INCORRECT" if firsts[-1].startswith("wrong_") else "CORRECT"
        assert messages[2]["content"].startswith(f"Your kernel was evaluated:\n\nVerdict: {verdict}")
        assert records[(task.name, 1)].status == verdict.lower()
        assert extract_code(messages[3]["content"]).strip() == solution_source(task, "fused").strip()
        assert records[(task.name, 2)].status == "correct"
    assert sorted(v if not v.startswith("wrong_") else "wrong" for v in firsts) == ["lazy", "partial", "wrong"]
    with pytest.raises(FileExistsError, match="sft.jsonl already exists"):
        build_sft_mix(config, tmp_path, device="cpu")
    # stopped before sft.jsonl was written (a time limit): the next build continues the judged run, judging nothing
    (tmp_path / "sft.jsonl").unlink()
    assert build_sft_mix(config, tmp_path, device="cpu") == summary
    assert [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()] == rows
    assert len(read_trajectories(tmp_path / "multi_turn_run")) == 6
