"""Loading, checking, selecting and pairing tasks and candidates (no network, no task code is run)."""

from __future__ import annotations

import json
import sys
import types
from collections import Counter
from pathlib import Path

import pytest

from drkernel.tasks import (
    Candidate,
    Task,
    TaskLoadError,
    TaskSelectionError,
    load_candidates,
    load_hub,
    load_jsonl,
    load_parquet,
    load_task_dir,
    load_task_file,
    load_tasks,
    pair_candidates,
    select_tasks,
)

TASK_CODE = """import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.rand(4, 4)]

def get_init_inputs():
    return []
"""

CANDIDATE_CODE = "class ModelNew:\n    pass\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    return write(path, "".join(json.dumps(row) + "\n" for row in rows))


# --- the real KernelBench data ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernelbench(kernelbench_path: Path) -> list[Task]:
    return load_tasks(kernelbench_path)


def test_real_jsonl_has_250_tasks_by_level(kernelbench: list[Task]) -> None:
    assert len(kernelbench) == 250
    assert Counter(task.level for task in kernelbench) == {1: 100, 2: 100, 3: 50}
    assert len({task.key for task in kernelbench}) == 250
    relu = next(task for task in kernelbench if task.name == "19_ReLU")
    assert (relu.key, relu.level, relu.problem_id) == ("L1/19_ReLU", 1, 19)


def test_real_jsonl_every_task_passes_the_structural_check(kernelbench: list[Task]) -> None:
    for task in kernelbench:
        task.check()
        assert task.problems() == []


def test_select_on_real_data(kernelbench: list[Task]) -> None:
    assert len(select_tasks(kernelbench, levels=[3])) == 50
    assert len(select_tasks(kernelbench, levels=[1, 3])) == 150
    assert [t.key for t in select_tasks(kernelbench, levels=[1], ids=[19, 20])] == ["L1/19_ReLU", "L1/20_LeakyReLU"]
    assert {t.level for t in select_tasks(kernelbench, ids=[1])} == {1, 2, 3}
    assert [t.key for t in select_tasks(kernelbench, names=["19_ReLU"])] == ["L1/19_ReLU"]
    assert [t.key for t in select_tasks(kernelbench, names=["L3/50_*"])] == ["L3/50_ReLUSelfAttention"]
    relus = select_tasks(kernelbench, levels=[1], names=["*ReLU"])
    assert [t.name for t in relus] == ["19_ReLU", "20_LeakyReLU"]


def test_select_that_matches_nothing_says_what_exists(kernelbench: list[Task]) -> None:
    with pytest.raises(TaskSelectionError, match=r"level 4 \(levels present: 1, 2, 3\).*1_Square_matrix"):
        select_tasks(kernelbench, levels=[4])
    with pytest.raises(TaskSelectionError, match=r"problem id 60 .*present: 1\.\.50.*L3/1_MLP"):
        select_tasks(kernelbench, levels=[3], ids=[60])
    with pytest.raises(TaskSelectionError, match=r"'no_such_task'.*available: L1/1_"):
        select_tasks(kernelbench, names=["19_ReLU", "no_such_task"])
    with pytest.raises(TaskSelectionError, match="matches no task"):
        select_tasks(kernelbench, levels=[])


# --- files and folders -----------------------------------------------------------------------------------------


def test_load_task_file_takes_name_id_and_level_from_the_path(tmp_path: Path) -> None:
    task = load_task_file(write(tmp_path / "level_2" / "7_Fused.py", TASK_CODE))
    assert (task.name, task.level, task.problem_id, task.key) == ("7_Fused", 2, 7, "L2/7_Fused")
    assert task.source == str(tmp_path / "level_2" / "7_Fused.py")
    plain = load_task_file(write(tmp_path / "relu.py", TASK_CODE))
    assert (plain.level, plain.problem_id, plain.key) == (None, None, "relu")


def test_structural_check_accepts_bindings_in_module_level_blocks(tmp_path: Path) -> None:
    code = (
        "from models import Model\n"
        "try:\n    import numpy\nexcept ImportError:\n    def get_inputs():\n        return []\n"
        "else:\n    get_inputs = lambda: []\n"
        "if True:\n    get_init_inputs: object = lambda: []\n"
    )
    assert Task(name="t", code=code).problems() == []
    assert Task(name="t", code="class Model: pass\nx[get_inputs] = 1\n").problems() == [
        "t: missing get_inputs, get_init_inputs at module level"
    ]


def test_load_task_dir_sorts_naturally_and_reads_level_subfolders(tmp_path: Path) -> None:
    for name in ["10_b.py", "2_a.py", "zeta.py", "alpha.py"]:
        write(tmp_path / "flat" / name, TASK_CODE)
    assert [t.name for t in load_task_dir(tmp_path / "flat")] == ["2_a", "10_b", "alpha", "zeta"]
    write(tmp_path / "kb" / "level2" / "1_x.py", TASK_CODE)
    write(tmp_path / "kb" / "level1" / "3_y.py", TASK_CODE)
    write(tmp_path / "kb" / "level1" / "12_z.py", TASK_CODE)
    assert [t.key for t in load_tasks(tmp_path / "kb")] == ["L1/3_y", "L1/12_z", "L2/1_x"]
    assert [t.key for t in load_task_dir(tmp_path / "kb" / "level1")] == ["L1/3_y", "L1/12_z"]


def test_load_task_dir_reports_every_bad_file_at_once(tmp_path: Path) -> None:
    write(tmp_path / "1_good.py", TASK_CODE)
    write(tmp_path / "2_syntax.py", "import torch\n\ndef get_inputs(:\n    pass\n")
    write(tmp_path / "3_no_inputs.py", TASK_CODE.replace("def get_inputs", "def make_inputs"))
    with pytest.raises(TaskLoadError) as info:
        load_task_dir(tmp_path)
    message = str(info.value)
    assert "2 problem(s)" in message
    assert f"{tmp_path / '2_syntax.py'} [2_syntax]: syntax error at line 3" in message
    assert f"{tmp_path / '3_no_inputs.py'} [3_no_inputs]: missing get_inputs at module level" in message
    assert "1_good" not in message


def test_load_task_file_and_dir_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="missing Model, get_inputs, get_init_inputs"):
        load_task_file(write(tmp_path / "empty.py", "import torch\n"))
    with pytest.raises(TaskLoadError, match="no .py task files"):
        load_task_dir(write(tmp_path / "nothing" / "notes.txt", "").parent)
    with pytest.raises(TaskLoadError, match="no such file or folder"):
        load_tasks(tmp_path / "absent.jsonl")
    with pytest.raises(TaskLoadError, match=r"expected a folder, a \.py, \.jsonl or \.parquet"):
        load_tasks(write(tmp_path / "tasks.csv", "code,name\n"))


# --- JSONL, parquet, hub ---------------------------------------------------------------------------------------


def test_load_jsonl_tolerates_missing_level_and_id(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "tasks.jsonl",
        [{"code": TASK_CODE, "name": "5_Add"}, {"code": TASK_CODE, "name": "Mul", "level": "2", "problem_id": None}],
    )
    tasks = load_jsonl(path)
    assert [(t.key, t.level, t.problem_id, t.source) for t in tasks] == [
        ("5_Add", None, 5, str(path)),
        ("L2/Mul", 2, None, str(path)),
    ]


def test_load_jsonl_reports_every_bad_row_with_its_line(tmp_path: Path) -> None:
    lines = [
        json.dumps({"code": TASK_CODE, "name": "1_ok", "level": 1}),
        "{not json",
        json.dumps({"name": "2_no_code"}),
        "",
        json.dumps({"code": "def get_inputs(): pass", "name": "3_partial", "level": 1}),
        json.dumps({"code": TASK_CODE, "name": "1_ok", "level": 1}),
        json.dumps({"code": TASK_CODE, "name": "4_bad_level", "level": "one"}),
    ]
    path = write(tmp_path / "bad.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(TaskLoadError) as info:
        load_jsonl(path)
    message = str(info.value)
    assert f"{path}:2: invalid JSON" in message
    assert f"{path}:3: missing or empty code" in message
    assert f"{path} [L1/3_partial]: missing Model, get_init_inputs" in message
    assert "duplicate task L1/1_ok" in message
    assert f"{path}:7: level is not an integer: 'one'" in message


def test_load_parquet_round_trip(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "level_1.parquet"
    table = pa.table(
        {
            "code": [TASK_CODE, TASK_CODE, TASK_CODE],
            "level": [1, 1, None],
            "name": ["19_ReLU", "20_LeakyReLU", "Extra"],
            "problem_id": [19, 20, None],
        }
    )
    pq.write_table(table, path)
    tasks = load_tasks(path)
    assert [(t.key, t.problem_id) for t in tasks] == [("L1/19_ReLU", 19), ("L1/20_LeakyReLU", 20), ("Extra", None)]
    pq.write_table(pa.table({"code": [TASK_CODE], "name": ["7_Only"]}), tmp_path / "bare.parquet")
    assert [(t.key, t.level, t.problem_id) for t in load_parquet(tmp_path / "bare.parquet")] == [("7_Only", None, 7)]


def test_load_parquet_without_pyarrow_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(TaskLoadError, match=r"pip install 'drkernel\[parquet\]'"):
        load_parquet(tmp_path / "x.parquet")


def test_load_hub_without_datasets_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    expected = r"hub needs the optional package 'datasets': pip install 'drkernel\[hub\]'"
    with pytest.raises(TaskLoadError, match=expected):
        load_hub()
    with pytest.raises(TaskLoadError, match=r"drkernel\[hub\]"):
        load_tasks("hub:")


def fake_datasets(splits: dict[str, list[dict]], requested: list[str]) -> types.ModuleType:
    """A stand-in for `datasets` whose load_dataset returns a DatasetDict-like mapping of split -> rows."""
    module = types.ModuleType("datasets")

    def load_dataset(name: str) -> dict[str, list[dict]]:
        requested.append(name)
        return splits

    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    return module


def test_load_hub_maps_splits_to_levels(monkeypatch: pytest.MonkeyPatch) -> None:
    splits = {
        "level_1": [{"code": TASK_CODE, "name": "19_ReLU", "level": 1, "problem_id": 19}],
        "level_2": [{"code": TASK_CODE, "name": "1_Conv"}],  # the split supplies the level
        "level_3": [{"code": TASK_CODE, "name": "1_MLP", "level": 3, "problem_id": 1}],
    }
    requested: list[str] = []
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets(splits, requested))
    tasks = load_hub(levels=[1, 2])
    assert [(t.key, t.problem_id, t.source) for t in tasks] == [
        ("L1/19_ReLU", 19, "hub:ScalingIntelligence/KernelBench/level_1"),
        ("L2/1_Conv", 1, "hub:ScalingIntelligence/KernelBench/level_2"),
    ]
    assert [t.key for t in load_tasks("hub:someone/Other")] == ["L1/19_ReLU", "L2/1_Conv", "L3/1_MLP"]
    assert requested == ["ScalingIntelligence/KernelBench", "someone/Other"]
    with pytest.raises(TaskLoadError, match="no split for level 5; splits: level_1, level_2, level_3"):
        load_hub(levels=[5])


# --- candidates ------------------------------------------------------------------------------------------------


@pytest.fixture()
def two_level_tasks() -> list[Task]:
    return [
        Task(name="19_ReLU", code=TASK_CODE, level=1, problem_id=19, source="t"),
        Task(name="20_LeakyReLU", code=TASK_CODE, level=1, problem_id=20, source="t"),
        Task(name="1_Conv", code=TASK_CODE, level=2, problem_id=1, source="t"),
        Task(name="19_Gemm", code=TASK_CODE, level=2, problem_id=19, source="t"),
    ]


def test_folder_candidates_with_variants_pair_with_tasks(tmp_path: Path, two_level_tasks: list[Task]) -> None:
    folder = tmp_path / "cands"
    write(folder / "19_ReLU.py", CANDIDATE_CODE)
    write(folder / "19_ReLU__fast.py", CANDIDATE_CODE)
    write(folder / "level2" / "1_Conv__v2.py", CANDIDATE_CODE)
    write(folder / "notes.txt", "not a candidate")
    candidates = load_candidates(folder)
    assert [(c.id, c.task) for c in candidates] == [
        ("19_ReLU", "19_ReLU"),
        ("19_ReLU__fast", "19_ReLU"),
        ("L2/1_Conv__v2", "L2/1_Conv"),
    ]
    first = Candidate(task="19_ReLU", code=CANDIDATE_CODE, id="19_ReLU", source=str(folder / "19_ReLU.py"))
    assert candidates[0] == first
    pairs = pair_candidates(two_level_tasks, reversed(candidates))
    assert [(task.key, cand.id) for task, cand in pairs] == [
        ("L1/19_ReLU", "19_ReLU__fast"),
        ("L1/19_ReLU", "19_ReLU"),
        ("L2/1_Conv", "L2/1_Conv__v2"),
    ]
    single = load_candidates(folder / "19_ReLU__fast.py")
    assert [(c.id, c.task) for c in single] == [("19_ReLU__fast", "19_ReLU")]


def test_jsonl_candidates_accept_alternative_field_names(tmp_path: Path, two_level_tasks: list[Task]) -> None:
    path = write_jsonl(
        tmp_path / "cands.jsonl",
        [
            {"task": "19_ReLU", "code": CANDIDATE_CODE, "id": "a"},
            {"task_id": "L1/20_LeakyReLU", "kernel_code": CANDIDATE_CODE},
            {"name": "1_Conv", "level": 2, "candidate": CANDIDATE_CODE},
            {"problem_id": 19, "level": 2, "code": CANDIDATE_CODE, "id": 7},
            {"problem_id": 20, "code": CANDIDATE_CODE},
        ],
    )
    candidates = load_candidates(path)
    assert [(c.id, c.task, c.source) for c in candidates] == [
        ("a", "19_ReLU", str(path)),
        ("L1/20_LeakyReLU__2", "L1/20_LeakyReLU", str(path)),
        ("L2/1_Conv__3", "L2/1_Conv", str(path)),
        ("7", "L2/19", str(path)),
        ("20__5", "20", str(path)),
    ]
    pairs = pair_candidates(two_level_tasks, candidates)
    assert [(task.key, cand.id) for task, cand in pairs] == [
        ("L1/19_ReLU", "a"),
        ("L1/20_LeakyReLU", "L1/20_LeakyReLU__2"),
        ("L1/20_LeakyReLU", "20__5"),
        ("L2/1_Conv", "L2/1_Conv__3"),
        ("L2/19_Gemm", "7"),
    ]


def test_jsonl_candidates_report_bad_rows_and_duplicate_ids(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "cands.jsonl",
        [
            {"task": "19_ReLU", "id": "x"},
            {"code": CANDIDATE_CODE},
            {"task": "19_ReLU", "code": CANDIDATE_CODE, "id": "dup"},
            {"task": "20_LeakyReLU", "code": CANDIDATE_CODE, "id": "dup"},
        ],
    )
    with pytest.raises(TaskLoadError) as info:
        load_candidates(path)
    message = str(info.value)
    assert f"{path}:1: missing or empty code (one of code, kernel_code, candidate)" in message
    assert f"{path}:2: missing task (one of task, task_id, name, problem_id)" in message
    assert "duplicate candidate id 'dup'" in message


def test_unmatched_and_ambiguous_candidates_are_named(two_level_tasks: list[Task]) -> None:
    candidates = [
        Candidate(task="99_Nothing", code=CANDIDATE_CODE, id="lost", source="c.jsonl"),
        Candidate(task="19", code=CANDIDATE_CODE, id="which", source="c.jsonl"),
        Candidate(task="19_ReLU", code=CANDIDATE_CODE, id="fine", source="c.jsonl"),
    ]
    with pytest.raises(TaskSelectionError) as info:
        pair_candidates(two_level_tasks, candidates)
    message = str(info.value)
    assert "2 candidate(s) match no single task" in message
    assert "candidate 'lost' (c.jsonl): no task '99_Nothing'" in message
    assert "candidate 'which': '19' is ambiguous (L1/19_ReLU, L2/19_Gemm)" in message
    assert "available: L1/19_ReLU, L1/20_LeakyReLU, L2/1_Conv, L2/19_Gemm" in message
    assert "fine" not in message


def test_candidate_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="no .py candidate files"):
        load_candidates(write(tmp_path / "empty" / "readme.md", "").parent)
    with pytest.raises(TaskLoadError, match="cannot tell the task"):
        load_candidates(write(tmp_path / "odd" / "__v1.py", CANDIDATE_CODE).parent)
    with pytest.raises(TaskLoadError, match="no such file or folder"):
        load_candidates(tmp_path / "absent")
    with pytest.raises(TaskLoadError, match="expected a folder of .py files"):
        load_candidates(write(tmp_path / "c.csv", ""))


def test_eval_level_takes_commas_like_bench_problems(monkeypatch):
    """`eval --level 1,2` selects levels 1 and 2, as `bench --problems 1,2` does ids (friction 8)."""
    from typer.testing import CliRunner

    from drkernel.cli import batch
    from drkernel.cli.main import app

    seen = []
    monkeypatch.setattr(batch, "run_batch", lambda tasks, cands, options, levels, *rest: seen.append(levels))
    result = CliRunner().invoke(app, ["eval", "--tasks", "t", "--candidates", "c", "--level", "1,2", "--level", "3"])
    assert result.exit_code == 0, result.output
    assert seen == [[1, 2, 3]]
    result = CliRunner().invoke(app, ["eval", "--tasks", "t", "--candidates", "c", "--level", "one"])
    assert result.exit_code == 2 and "--level takes numbers" in result.output
