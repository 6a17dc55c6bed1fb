"""`drkernel report` on the small recorded runs of tests/data/report: every table number against drkernel.rl
computed here from the raw records, the published rows, runs still being written, bad input, real PNGs, a
self-contained HTML page and, where Chromium is installed, the page rendered with its figures."""

from __future__ import annotations

import base64
import csv
import json
import math
import re
import shutil
import struct
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from drkernel.cli.main import app
from drkernel.report.runs import RunReadError, read_run
from drkernel.rl import (
    fast_p,
    fast_p_best_of_history,
    fast_p_last_turn,
    fast_p_per_turn,
    geometric_mean_speedup,
    pass_at_k,
)

DATA = Path(__file__).resolve().parent / "data" / "report"
RUNS = ["bench_examples", "bench_gpu", "bench_cpu", "train_run"]
NAMES = {"bench_examples": "bench_examples", "bench_gpu": "bench_gpu", "bench_cpu": "bench_cpu",
         "train_run": "train_run (validation, step 4)"}
TRAJECTORY_FILES = {"bench_examples": DATA / "bench_examples", "bench_gpu": DATA / "bench_gpu",
                    "bench_cpu": DATA / "bench_cpu", "train_run": DATA / "train_run" / "validation" / "step_4"}
NOT_MEASURED = "(published, not measured here)"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    result = CliRunner().invoke(app, ["report", *(str(DATA / r) for r in RUNS), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert str(out / "report.html") in result.output
    return out


def records(run: str) -> list[dict]:
    """The raw JSON lines of a run, read independently of drkernel.report (the partial last line dropped)."""
    lines = (TRAJECTORY_FILES[run] / "trajectories.jsonl").read_text().split("\n")
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            assert line is lines[-1] or not line.strip()
    return rows


def arrays(run: str) -> tuple[list[tuple[str, int]], torch.Tensor, torch.Tensor, torch.Tensor]:
    """keys, speedup, correct, reached [N, T] of a run's trajectories."""
    rows = records(run)
    keys = sorted({(r["task"], r["sample"]) for r in rows})
    width = max(r["turn"] for r in rows)
    speedup = torch.full((len(keys), width), math.nan, dtype=torch.float64)
    correct = torch.zeros(len(keys), width, dtype=torch.bool)
    reached = torch.zeros(len(keys), width, dtype=torch.bool)
    for r in rows:
        i, t = keys.index((r["task"], r["sample"])), r["turn"] - 1
        result = r["result"] or {}
        speedup[i, t] = math.nan if result.get("speedup") is None else result["speedup"]
        correct[i, t] = bool(result.get("correct"))
        reached[i, t] = True
    return keys, speedup, correct, reached


def table(report: Path, name: str) -> list[dict[str, str]]:
    with (report / "tables" / f"{name}.csv").open() as handle:
        return list(csv.DictReader(handle))


def said(result) -> str:
    """The CLI's output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def number(cell: str) -> float:
    return math.nan if cell == "" else float(cell)


def close(cell: str, expected: float) -> bool:
    return (cell == "" and math.isnan(expected)) or number(cell) == pytest.approx(expected, abs=1e-9)


def test_level_table_matches_drkernel_rl(report: Path) -> None:
    rows = table(report, "levels")
    checked = 0
    for run in RUNS:
        last: dict[tuple[str, int], dict] = {}
        for r in records(run):  # the last turn of each trajectory
            if r["turn"] >= last.get((r["task"], r["sample"]), {"turn": 0})["turn"]:
                last[(r["task"], r["sample"])] = r
        groups: dict[str, list[dict]] = defaultdict(list)
        for r in last.values():
            groups["unknown" if r["level"] is None else str(r["level"])].append(r)
        if len(groups) > 1:
            groups["all"] = list(last.values())
        for level, members in groups.items():
            (row,) = [x for x in rows if x["run"] == NAMES[run] and x["level"] == level]
            speed = [math.nan if (m["result"] or {}).get("speedup") is None else m["result"]["speedup"]
                     for m in members]
            ok = [bool((m["result"] or {}).get("correct")) for m in members]
            assert int(row["trajectories"]) == len(members)
            assert close(row["correct (%)"], 100 * sum(ok) / len(ok))
            assert close(row["Fast@0 (%)"], 100 * sum(ok) / len(ok))
            for p in (1, 1.2, 1.5, 2):
                assert close(row[f"Fast@{p} (%)"], 100 * fast_p(speed, ok, p))
            assert close(row["geo-mean speedup (correct)"], geometric_mean_speedup(speed, ok))
            n = Counter(m["task"] for m in members)
            c = Counter(m["task"] for m in members if m["result"] and m["result"]["correct"])
            assert int(row["tasks"]) == len(n)
            for k in (1, 2, 3):
                expected = (sum(pass_at_k(n[t], c[t], k) for t in n) / len(n)) if k <= min(n.values()) else math.nan
                assert close(row[f"pass@{k} (%)"], 100 * expected)
            checked += 1
    assert checked == 1 + 4 + 3 + 3  # bench_examples: unknown only; bench_gpu: levels 1, 2, unknown and all
    assert len(rows) == checked + 3  # and the paper's three Level 2 rows


def test_turn_table_matches_drkernel_rl(report: Path) -> None:
    rows = table(report, "turns")
    for run in RUNS:
        _, speedup, correct, reached = arrays(run)
        mine = [r for r in rows if r["run"] == NAMES[run]]
        assert [int(r["turn"]) for r in mine] == list(range(1, speedup.shape[1] + 1))
        for p in (1, 1.2):
            per_turn = fast_p_per_turn(speedup, correct, p, reached)
            best = fast_p_best_of_history(speedup, correct, p, reached)
            for t, row in enumerate(mine):
                last = fast_p_last_turn(speedup[:, : t + 1], correct[:, : t + 1], p, reached[:, : t + 1])
                assert close(row[f"Fast@{p} of the turn (%)"], 100 * per_turn[t].item())
                assert close(row[f"Fast@{p} last turn (%)"], 100 * last)
                assert close(row[f"Fast@{p} best of history (%)"], 100 * best[t].item())
                for what, share in (("last turn", last), ("best of history", best[t].item())):
                    low, high = (number(end) for end in row[f"Fast@{p} {what}, 95% interval"].split(" to "))
                    assert low - 1e-9 <= 100 * share <= high + 1e-9 and 0 <= low <= high <= 100
                assert int(row["reached"]) == int(reached[:, t].sum())
                share = (correct[:, t] & reached[:, t]).sum().item() / reached[:, t].sum().item()
                assert close(row["correct (%)"], 100 * share)
    # the run still being written: two trajectories stopped at turn 2
    cpu = [r for r in rows if r["run"] == "bench_cpu"]
    assert [int(r["reached"]) for r in cpu] == [8, 8, 6]
    (stts,) = [r for r in rows if NOT_MEASURED in r["run"]]
    assert stts["run"] == f"Dr. Kernel-14B, STTS {NOT_MEASURED}"
    assert (stts["Fast@1.2 last turn (%)"], stts["Fast@1.2 best of history (%)"]) == ("31.6", "47.8")
    assert stts["turn"] == stts["Fast@1 last turn (%)"] == stts["Fast@1.2 last turn, 95% interval"] == ""


def test_the_interval_over_tasks_draws_tasks_whole() -> None:
    from drkernel.report.metrics import task_intervals

    # two tasks, one always fast, one never: a draw holds both (mean 1/2), or one twice (0 or 1)
    hits = torch.tensor([[True], [True], [False], [False]])
    ((low, high),) = task_intervals(hits, ["a", "a", "b", "b"])
    assert (low, high) == (0.0, 1.0)
    # tasks that all agree leave nothing to draw: the interval is the share itself
    ((low, high),) = task_intervals(torch.tensor([[True], [False]] * 4), ["a", "a", "b", "b", "c", "c", "d", "d"])
    assert low == high == 0.5
    # more tasks of the same kind narrow it; the same seed gives the same ends
    few = task_intervals(torch.tensor([[i % 2 == 0] for i in range(8)]), [str(i) for i in range(8)])
    many = task_intervals(torch.tensor([[i % 2 == 0] for i in range(200)]), [str(i) for i in range(200)])
    assert few[0][1] - few[0][0] > 2 * (many[0][1] - many[0][0]) > 0
    assert few == task_intervals(torch.tensor([[i % 2 == 0] for i in range(8)]), [str(i) for i in range(8)])
    assert task_intervals(torch.tensor([[True, False]]), ["only"]) == [None, None]


def test_outcome_table_counts_each_status_and_hack_reason(report: Path) -> None:
    rows = table(report, "outcomes")
    for run in RUNS:
        expected: dict[int, Counter] = defaultdict(Counter)
        for r in records(run):
            category = r["status"] if r["status"] != "hacked" else f"hacked: {r['result']['hack_reasons'][0]}"
            expected[r["turn"]][category] += 1
        for row in (x for x in rows if x["run"] == NAMES[run]):
            got = {k: int(v) for k, v in row.items() if k not in ("run", "turn") and v and int(v)}
            assert got == dict(expected[int(row["turn"])])
    gpu = [r for r in rows if r["run"] == "bench_gpu"]
    assert sum(int(r["format_error"]) for r in gpu) == 5
    assert sum(int(r["hacked: torch_fallback"]) for r in gpu) == 2


def test_task_table_best_speedups_and_code_links(report: Path) -> None:
    rows = {r["task"]: r for r in table(report, "tasks")}
    for run in RUNS:
        by_task: dict[str, list[dict]] = defaultdict(list)
        for r in records(run):
            by_task[r["task"]].append(r)
        for task, turns in by_task.items():
            row = rows[task]
            good = [r for r in turns if r["result"] and r["result"]["correct"]]
            if not good:
                assert row[f"{NAMES[run]}: best speedup"] == "" and row[f"{NAMES[run]}: best code"] == ""
                continue
            top = max(r["result"]["speedup"] for r in good)
            in_order = sorted(good, key=lambda r: (r["sample"], r["turn"]))
            best = next(r for r in in_order if r["result"]["speedup"] == top)  # the earliest on ties
            assert float(row[f"{NAMES[run]}: best speedup"]) == top
            assert row[f"{NAMES[run]}: reached at"] == f"s{best['sample']}/t{best['turn']}"
            assert (report / row[f"{NAMES[run]}: best code"]).read_text() == best["code"]
            with_code = sorted((r for r in turns if r["code"] is not None), key=lambda r: (r["sample"], r["turn"]))
            worst = min(with_code, key=lambda r: r["reward"])  # the earliest on ties
            assert (report / row[f"{NAMES[run]}: worst code"]).read_text() == worst["code"]
    assert set(rows) == {"L1/1_matmul", "L1/2_relu", "L2/3_conv_bias", "L2/4_gemm_gelu", "misc_softmax",
                         "1_vector_add", "2_relu", "3_softmax_rows", "4_matmul_small", "5_layernorm"}


def test_real_bench_run_agrees_with_the_agent_loops_own_summary(report: Path) -> None:
    """bench_examples was recorded by `drkernel bench` (tests/data/report/make_bench_examples.py); its
    summary.json was computed by the agent loop's own code, independently of drkernel.report."""
    summary = json.loads((DATA / "bench_examples" / "summary.json").read_text())
    (level,) = [r for r in table(report, "levels") if r["run"] == "bench_examples"]
    assert close(level["correct (%)"], 100 * summary["last_turn"]["correct"])
    assert close(level["Fast@1 (%)"], 100 * summary["last_turn"]["fast_1"])
    assert close(level["Fast@1.2 (%)"], 100 * summary["last_turn"]["fast_1_2"])
    turns = [r for r in table(report, "turns") if r["run"] == "bench_examples"]
    assert [int(r["reached"]) for r in turns] == summary["per_turn"]["trajectories"]
    for t, row in enumerate(turns):
        assert close(row["correct (%)"], 100 * summary["per_turn"]["correct"][t])
        assert close(row["Fast@1 of the turn (%)"], 100 * summary["per_turn"]["fast_1"][t])
        assert close(row["Fast@1.2 of the turn (%)"], 100 * summary["per_turn"]["fast_1_2"][t])
    assert close(turns[-1]["Fast@1.2 best of history (%)"], 100 * summary["best_of_history"]["fast_1_2"])
    statuses: Counter = Counter()
    for row in (r for r in table(report, "outcomes") if r["run"] == "bench_examples"):
        for key, value in row.items():
            if key not in ("run", "turn") and value:
                statuses[key.split(":")[0]] += int(value)
    assert {k: v for k, v in statuses.items() if v} == summary["statuses"]
    assert [r["level"] for r in table(report, "levels") if r["run"] == "bench_examples"] == ["unknown"]


def test_published_numbers_are_labelled_and_extendable(report: Path, tmp_path: Path) -> None:
    paper = {r["run"]: r for r in table(report, "levels") if NOT_MEASURED in r["run"]}
    assert {k: (v["level"], float(v["Fast@1 (%)"]), float(v["Fast@1.2 (%)"])) for k, v in paper.items()} == {
        f"GPT-5 {NOT_MEASURED}": ("2", 46.7, 28.6),
        f"Claude-4.5-Sonnet {NOT_MEASURED}": ("2", 50.0, 26.7),
        f"Dr. Kernel-14B {NOT_MEASURED}": ("2", 49.2, 25.6),
    }
    assert "Dr. Kernel, arXiv 2602.05885" in (report / "tables" / "levels.md").read_text()
    extra = tmp_path / "mine.yaml"
    extra.write_text("source: my notes\nunit: fraction\nentries:\n  - {label: Baseline, level: 1, fast_1: 0.25}\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["report", str(DATA / "bench_gpu"), "--out", str(out), "--no-paper",
                                      "--published", str(extra)])
    assert result.exit_code == 0, result.output
    rows = table(out, "levels")
    assert [(r["run"], r["level"], r["Fast@1 (%)"]) for r in rows if NOT_MEASURED in r["run"]] == [
        (f"Baseline {NOT_MEASURED}", "1", "25")]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"entries": [{"label": "X", "level": 2, "fast_3": 10}]}))
    result = CliRunner().invoke(app, ["report", str(DATA / "bench_gpu"), "--out", str(out), "--published", str(bad)])
    assert result.exit_code == 2
    assert "entry 1 (X): unknown metric(s) fast_3" in said(result)


def test_runs_still_being_written_and_bad_records(tmp_path: Path) -> None:
    run = read_run(DATA / "bench_cpu")
    assert len(run.turns) == 22 and run.summary is None
    assert run.notes == ["trajectories.jsonl: skipped the partial last line 23 (the run is still being written)",
                         "no summary.json: the run may still be going"]
    broken = tmp_path / "broken"
    broken.mkdir()
    lines = (DATA / "bench_gpu" / "trajectories.jsonl").read_text().splitlines()
    (broken / "trajectories.jsonl").write_text("\n".join([lines[0], lines[1][:50], lines[2]]) + "\n")
    with pytest.raises(RunReadError, match=r"broken/trajectories.jsonl:2: not JSON"):
        read_run(broken)
    row = json.loads(lines[0])
    del row["result"], row["reward"]
    (broken / "trajectories.jsonl").write_text(lines[1] + "\n" + json.dumps(row) + "\n")
    with pytest.raises(RunReadError, match=r"trajectories.jsonl:2: missing required field\(s\) 'result', 'reward'"):
        read_run(broken)
    (broken / "trajectories.jsonl").write_text(lines[0] + "\n" + lines[0] + "\n")
    with pytest.raises(RunReadError, match=r":2: task 'L1/1_matmul' sample 0 turn 1 was already recorded on line 1"):
        read_run(broken)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "nothing_here"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "nothing_here: not a folder" in said(result)


def test_failed_model_calls_whose_turns_are_missing_are_noted(tmp_path: Path) -> None:
    run_dir = tmp_path / "failed_calls"
    shutil.copytree(DATA / "bench_gpu", run_dir)
    first = json.loads((run_dir / "trajectories.jsonl").read_text().splitlines()[0])
    failures = [{"task": first["task"], "sample": first["sample"], "turn": first["turn"], "cause": "HTTP 500"},
                {"task": "L1/1_matmul", "sample": 7, "turn": 1, "cause": "HTTP 500", "time": "2026-01-01T00:00:00"},
                {"task": "L1/1_matmul", "sample": 7, "turn": 1, "cause": "again", "time": "2026-01-01T00:01:00"}]
    (run_dir / "generation_errors.jsonl").write_text("".join(json.dumps(row) + "\n" for row in failures))
    run = read_run(run_dir)  # the first failure was completed by a resume; the other turn is still missing
    assert run.notes == [f"1 turn(s) missing because the model call failed for good (generation_errors.jsonl): their "
                         f"trajectories stop early; `drkernel bench --out {run_dir} --resume` asks them again"]
    assert len(run.turns) == len(read_run(DATA / "bench_gpu").turns)


def test_training_run_without_validation_draws_its_curves(tmp_path: Path) -> None:
    run_dir = tmp_path / "fresh_training"
    run_dir.mkdir()
    metrics = (DATA / "train_run" / "metrics.jsonl").read_text()
    (run_dir / "metrics.jsonl").write_text(metrics + '{"step": 5, "reward_me')  # step 5 being written
    result = CliRunner().invoke(app, ["report", str(run_dir), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "no validation records yet: training curves only" in said(result)
    assert "metrics.jsonl: skipped the partial last line 5" in said(result)
    assert [step["step"] for step in read_run(run_dir).steps] == [1, 2, 3, 4]
    assert sorted(p.name for p in (tmp_path / "o" / "figures").iterdir()) == ["training.png"]
    assert sorted(p.name for p in (tmp_path / "o" / "tables").iterdir()) == ["training.csv", "training.md"]
    # the run's thirds (4 steps: 1, 2-3, 4), each a mean of what its steps logged; no kinds logged: "-"
    rows = list(csv.reader((tmp_path / "o" / "tables" / "training.csv").read_text().splitlines()))
    assert rows[0][:5] == ["run", "steps", "reward", "Fast@1.2 first turn (%)", "Fast@1.2 last turn (%)"]
    assert [row[:5] for row in rows[1:]] == [["fresh_training", "1-1", "0.3824", "5", "15"],
                                             ["fresh_training", "2-3", "0.5401", "5", "15"],
                                             ["fresh_training", "4-4", "0.6572", "5", "15"]]
    assert [row[5:9] for row in rows[1:]] == [["", "", "", ""]] * 3 and [row[9] for row in rows[1:]] == ["50"] * 3
    assert "Training runs by thirds of their steps" in (tmp_path / "o" / "report.html").read_text()


def test_a_run_s_thirds_set_its_start_against_its_end() -> None:
    from drkernel.report.metrics import step_thirds

    steps = [{"step": i, "reward_mean": float(i), "turn_fast_1_2": [i / 10, 0.0],
              "turn_kind_shares": [{"fused": i / 10, "lazy": 1 - i / 10, "partial": 0.0, "failed": 0.0}]}
             for i in range(1, 11)]
    spans = step_thirds("r", steps)
    assert [(s.first, s.last, s.reward) for s in spans] == [(1, 3, 2.0), (4, 7, 5.5), (8, 10, 9.0)]
    assert spans[2].first_answer_kinds == pytest.approx({"fused": 0.9, "lazy": 0.1, "partial": 0.0, "failed": 0.0})
    assert spans[0].fast_1_2_first_turn == pytest.approx(0.2) and spans[0].fast_1_2_last_turn == 0.0
    assert [(s.first, s.last) for s in step_thirds("r", steps[:2])] == [(1, 1), (2, 2)]
    assert [(s.first, s.last, s.coverage) for s in step_thirds("r", steps[:1])] == [(1, 1, None)]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_figures_are_real_images_and_the_html_is_self_contained(report: Path) -> None:
    names = ["coverage", "levels", "outcomes", "speedups", "training", "turns"]
    assert sorted(p.stem for p in (report / "figures").iterdir()) == names
    import matplotlib.image

    for name in names:
        width, height = png_size(report / "figures" / f"{name}.png")
        assert width >= 600 and height >= 300
        pixels = torch.from_numpy(matplotlib.image.imread(report / "figures" / f"{name}.png"))
        assert (pixels[..., :3] < 0.9).any(-1).double().mean() > 0.02, f"{name}.png is nearly blank"
    html = (report / "report.html").read_text()
    # no resource fetched from the network (config.json's base_url may be shown as text)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|url\(|@import""", html)
    assert "http://127.0.0.1" in html  # bench_examples' config, shown as text
    sources = re.findall(r'<img src="([^"]+)"', html)
    assert len(sources) == len(names)
    for source in sources:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    for href in re.findall(r'href="([^"]+)"', html):
        assert (report / href).is_file(), href
    assert html.count(NOT_MEASURED) == 4  # three level rows and the STTS row of the turn table
    for name in ("levels", "turns", "outcomes", "kinds", "tasks"):
        assert (report / "tables" / f"{name}.md").read_text().startswith("### ")
    assert '<h2 id="kinds">Answer kinds</h2>' in html


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
PROBE = """<script>window.addEventListener("load", function () {
  document.querySelectorAll("img").forEach(function (img) {
    img.setAttribute("data-rendered", img.naturalWidth + "x" + img.naturalHeight + "@" + img.width);
  });
});</script></body>"""


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium)")
def test_chromium_renders_the_report_with_its_figures(report: Path, tmp_path: Path) -> None:
    probed = report / "probed.html"
    probed.write_text((report / "report.html").read_text().replace("</body>", PROBE))
    common = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000"]
    dom = subprocess.run([*common, "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=120)
    rendered = re.findall(r'data-rendered="(\d+)x(\d+)@(\d+)"', dom.stdout)
    assert len(rendered) == 6, dom.stderr[-2000:]
    for natural_w, natural_h, shown_w in rendered:
        assert int(natural_w) >= 600 and int(natural_h) >= 300 and int(shown_w) >= 600
    # the figures are what makes the page colourful: compare with the same page without its images
    bare = report / "bare.html"
    bare.write_text(re.sub(r"<img [^>]*>", "", (report / "report.html").read_text()))
    import matplotlib.image

    colourful = []
    for page in (report / "report.html", bare):
        shot = tmp_path / f"{page.stem}.png"
        subprocess.run([*common, "--window-size=1400,3000", f"--screenshot={shot}", page.as_uri()],
                       capture_output=True, timeout=120, check=True)
        pixels = torch.from_numpy(matplotlib.image.imread(shot))[..., :3]
        assert pixels.shape[:2] == (3000, 1400)
        colourful.append(int((pixels.max(-1).values - pixels.min(-1).values > 0.3).sum()))
    assert colourful[0] > 20_000 and colourful[1] < 5_000, colourful


def test_figures_fit_what_they_show(tmp_path, monkeypatch):
    """Friction 7: a one-step training curve has a marker; paper bars only beside the runs' own levels; the speedup
    axis over more than a decade labels no minor ticks (they overlapped)."""
    from drkernel.report import figures
    from drkernel.report.metrics import LevelStats
    from drkernel.report.published import Published

    drawn = []
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.append(fig) or path)
    figures.training_figure([("run", [{"step": 1, "reward_mean": 0.5, "reward_std": 0.1}])], tmp_path / "t.png")
    [line] = drawn[-1].axes[0].get_lines()
    assert line.get_marker() == "o"

    # the step's own prompts: Fast@1.2 of its first and last turn, and its first answers' kinds (the miniature's
    # runs record no validation: this is where they move)
    kinds = [{"fused": 0.25, "partial": 0.5, "lazy": 0.125}, {"fused": 0.5, "partial": 0.0, "lazy": 0.0}]
    figures.training_figure([("run", [{"step": step, "turn_fast_1_2": [0.1 * step, 0.2 * step, 0.3 * step],
                                       "turn_kind_shares": kinds} for step in (1, 2)])], tmp_path / "t.png")
    fast, first_kinds = drawn[-1].axes[1], drawn[-1].axes[2]
    assert {line.get_label(): list(line.get_ydata()) for line in fast.get_lines()} == {
        "run: fast_1_2_first_turn": [10.0, 20.0], "run: fast_1_2_last_turn": [30.0, 60.0]}
    assert {line.get_label(): list(line.get_ydata()) for line in first_kinds.get_lines()} == {
        "run: fused": [25.0, 25.0], "run: partial": [50.0, 50.0], "run: lazy": [12.5, 12.5]}

    stats = [LevelStats("run", "unknown", 1, 1, 1.0, {1.0: 0.5, 1.2: 0.0}, 1.0, {1: 1.0})]
    paper = Published("paper", "src", 2, {key: 0.3 for key in figures_metric_keys()})
    figures.levels_figure(stats, [paper], tmp_path / "l.png")
    for ax in drawn[-1].axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["unknown"]
        assert len(ax.patches) == 1  # the run's bar, no level-2 paper bar

    figures.speedups_figure([("run", [0.05, 0.5, 3.0])], True, tmp_path / "s.png")
    ax = drawn[-1].axes[0]
    assert not [t for t in ax.xaxis.get_minor_formatter().format_ticks([0.2, 0.3, 0.4]) if t]

    # the published Fast@1.2 lines (drawn in the second panel only) stay inside the shared y axis, whatever the
    # first panel's curves reach
    from drkernel.report.metrics import TurnCurves

    curves = [TurnCurves("run", [4, 4], [0.25, 0.0], *({1.0: [0.3, 0.0], 1.2: [0.0, 0.0]},) * 3)]
    stts = Published("stts", "src", 2, {"last_turn_fast_1_2": 0.316, "best_of_history_fast_1_2": 0.478})
    figures.turns_figure(curves, [stts], tmp_path / "u.png")
    fast_1_2 = drawn[-1].axes[1]
    published = [line.get_ydata()[0] for line in fast_1_2.get_lines() if line.get_color() == "grey"]
    assert sorted(published) == [pytest.approx(31.6), pytest.approx(47.8)]
    assert fast_1_2.get_ylim()[1] > 47.8


def figures_metric_keys() -> list[str]:
    from drkernel.report.published import METRICS

    return [key for key, (kind, _) in METRICS.items() if kind == "level"]


def test_the_report_says_which_precision_rule_each_run_was_judged_by() -> None:
    from pathlib import Path

    from drkernel.report.build import precision_note
    from drkernel.report.runs import Run

    old, new = Run("old", Path("."), [], {}), Run("new", Path("."), [], {"precision": "matched"})
    nested = Run("nested", Path("."), [], {"evaluation": {"precision": "tolerance"}})  # config.json since issue 22
    note = precision_note([old, new, nested])
    assert "old: tolerance (made before the rule existed)" in note and "new: matched" in note
    assert "nested: tolerance;" not in note and "nested: tolerance." in note


def test_differences_pair_each_task_with_itself() -> None:
    from drkernel.report.metrics import Trajectories, paired_differences
    from drkernel.report.runs import Turn
    from drkernel.report.tables import differences_table

    def turns(plan: dict[str, list[list[float | None]]]) -> Trajectories:
        """task -> per sample, the speedup of each turn (None: incorrect)."""
        return Trajectories.of([
            Turn(task, None, sample, t, "correct" if s else "incorrect", s is not None, s or math.nan, math.nan, (),
                 0.0, None, False)
            for task, samples in plan.items() for sample, speedups in enumerate(samples)
            for t, s in enumerate(speedups, 1)])

    base = turns({"a": [[1.0, 2.0], [1.0, 1.0]], "b": [[2.0, 2.0], [2.0, 2.0]], "c": [[None, None], [None, None]]})
    other = turns({"a": [[2.0], [2.0]], "b": [[2.0], [2.0]], "c": [[None], [None]], "d": [[9.0], [9.0]]})
    rows = {(d.p, d.measure): d for d in paired_differences("other", other, "base", base)}
    first, last, best = (rows[(1.2, m)] for m in ("first turn", "last turn", "best of history"))
    assert first.tasks == 3  # d is the other run's alone: not paired
    assert (first.share, first.share_against, first.difference) == pytest.approx((2 / 3, 1 / 3, 1 / 3))
    assert (first.better, first.worse, first.same) == (1, 0, 2)
    # the base's task a ends fast in one sample of two; the other run's in both
    assert (last.share_against, last.difference) == pytest.approx((1 / 2, 1 / 6))
    assert (best.share_against, best.difference) == pytest.approx((1 / 2, 1 / 6))
    low, high = first.interval
    assert 0.0 <= low <= first.difference <= high <= 1.0
    assert paired_differences("other", turns({"a": [[2.0]], "z": [[2.0]]}), "base", base) == []
    worse = paired_differences("base", base, "other", other)
    shown = differences_table(worse).markdown()
    assert "| base | other | Fast@1.2 first turn | 3 | 33.3 | 66.7 | -33.3 |" in shown
    assert f"{100 * worse[3].interval[0]:.1f} to {100 * worse[3].interval[1]:.1f}" in shown


def test_the_phases_table_gives_each_run_s_median_seconds_per_phase(report: Path) -> None:
    """Computed here from the raw records: the evaluations judged in the run (not cached), their `duration_s` and
    `phases_s`, the agent's wait for their verdicts; generation over every turn. bench_gpu's records hold none."""
    import statistics

    rows = {row[0]: row for row in csv.reader((report / "tables" / "phases.csv").read_text().splitlines())}
    header = rows.pop("run")
    assert header[:3] == ["run", "evaluations judged", "duration"] and header[-2:] == ["evaluation", "generation"]
    judged = [r for r in records("bench_examples") if r["result"] and not r["result"].get("cached")]
    expected = {"duration": [r["result"]["duration_s"] for r in judged],
                "correctness": [r["result"]["phases_s"]["correctness"] for r in judged
                                if "correctness" in r["result"].get("phases_s", {})],
                "evaluation": [r["timings"]["evaluation_s"] for r in judged],
                "generation": [r["timings"]["generation_s"] for r in records("bench_examples")]}
    row = dict(zip(header, rows["bench_examples"]))
    assert int(row["evaluations judged"]) == len(judged) > 0
    for name, values in expected.items():
        assert float(row[name]) == pytest.approx(statistics.median(values)), name
    gpu = [r for r in records("bench_gpu") if r["result"] and not r["result"].get("cached")]
    gpu_row = dict(zip(header, rows["bench_gpu"]))  # older records: the agent's timings, no phases
    assert int(gpu_row["evaluations judged"]) == len(gpu) > 0 and gpu_row["duration"] == gpu_row["correctness"] == ""
    assert float(gpu_row["evaluation"]) == pytest.approx(statistics.median(r["timings"]["evaluation_s"] for r in gpu))
    assert "Where the time goes" in (report / "report.html").read_text()


def _bench_run(folder: Path, plan: dict[str, list[float | None]], config: dict) -> Path:
    """A one-turn bench run: task -> per sample, the speedup of its answer (None: incorrect)."""
    folder.mkdir(parents=True)
    rows = [{"task": task, "level": None, "sample": sample, "turn": 1, "status": "correct" if s else "incorrect",
             "result": {"correct": s is not None, "speedup": s}, "reward": 0.0, "code": "pass"}
            for task, speedups in plan.items() for sample, s in enumerate(speedups)]
    (folder / "trajectories.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "summary.json").write_text("{}")
    return folder


def test_replicates_pooled_into_one_run(tmp_path: Path) -> None:
    """Each replicate's samples of a task become the pooled run's, so a task's share is the mean of the
    replicates' shares, and the paired difference against the baseline is the replicates' mean difference."""
    from drkernel.report import write_report
    from drkernel.report.runs import pool_runs

    settings = {"model": "hf:a", "temperature": 1.0}
    base = _bench_run(tmp_path / "base", {"a": [None, None], "b": [2.0, None]}, settings)
    one = _bench_run(tmp_path / "one", {"a": [2.0, None], "b": [2.0, 2.0]}, settings)
    two = _bench_run(tmp_path / "two", {"a": [2.0, 2.0], "b": [None, None]}, {**settings, "model": "hf:b"})
    pooled = pool_runs("both", [one, two])
    assert sorted((t.task, t.sample) for t in pooled.turns) == [(task, s) for task in "ab" for s in range(4)]
    assert pooled.notes == [f"pooled from 2 bench runs: {one}, {two}"]  # the model may differ: it is the replicate
    report = write_report([base], tmp_path / "out", paper=False, pools=[("both", [one, two])])
    first = next(row for row in table(report.out, "differences") if row["measure"] == "Fast@1.2 first turn")
    assert first["run"] == "both" and first["against"] == "base"
    # per task: a 3/4 against 0, b 2/4 against 1/2; so 62.5% against 25%
    assert (number(first["run (%)"]), number(first["against (%)"]), number(first["difference (points)"])) == (
        pytest.approx(62.5), pytest.approx(25.0), pytest.approx(37.5))
    three = _bench_run(tmp_path / "three", {"a": [2.0]}, {**settings, "temperature": 0.5})
    assert pool_runs("mixed", [one, three]).notes[-1] == (
        "the pooled runs differ in temperature: they may not be replicates of one setting")
    with pytest.raises(RunReadError, match="at least two bench runs, got 1"):
        pool_runs("alone", [one])
    trained = tmp_path / "trained"
    shutil.copytree(DATA / "train_run", trained)
    with pytest.raises(RunReadError, match="trained is not a bench run"):
        pool_runs("mixed", [one, trained])
    result = CliRunner().invoke(app, ["report", str(base), "--pool", f"{one},{two}", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--pool takes NAME=DIR,DIR,..." in said(result)
    result = CliRunner().invoke(app, ["report", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "no run to report" in said(result)
    result = CliRunner().invoke(app, ["report", str(base), "--pool", f"both={one},{two}", "--out",
                                      str(tmp_path / "cli"), "--no-paper"])
    assert result.exit_code == 0, result.output
    assert table(tmp_path / "cli", "differences") == table(report.out, "differences")


def test_the_timing_table_counts_unsteady_gpu_timings(tmp_path: Path) -> None:
    """On four H200s of one host (2026-11-26) a fifth of the candidates' medians were slow calls (above twice the fastest), never the reference's.
    Counted over results judged in the run with CUDA event timings; cached and CPU ones left out."""
    from drkernel.report import write_report

    def stats(median: float, fastest: float, method: str = "cuda_event") -> dict:
        return {"median_ms": median, "iqr_ms": 0.0, "mean_ms": median, "min_ms": fastest, "trials": 10,
                "method": method}

    def row(task: str, timing: dict | None, cached: bool = False) -> dict:
        return {"task": task, "level": None, "sample": 0, "turn": 1, "status": "correct", "reward": 1.0,
                "code": "pass", "result": {"correct": True, "speedup": 1.0, "cached": cached, "timing": timing}}

    steady = {"reference": stats(0.1, 0.1), "candidate": stats(0.05, 0.05)}
    # every call kept, with what the host went through: two slow calls, one of them blocked in the kernel
    steady["candidate"] = {**steady["candidate"], "samples_ms": [0.05, 0.05, 3.0, 0.06, 0.2],
                           "host_interruptions": [[0, 0, 0], [0, 0, 1], [2, 0, 0], [1, 0, 0], [0, 0, 0]],
                           "driver_allocations": [0, 0, 0, 0, 3]}  # the last slow call allocated
    rows = [row("steady", steady),
            row("slow", {"reference": stats(0.1, 0.1), "candidate": stats(3.3, 0.07)}),
            row("again", {**steady, "measurements": 2}),
            row("both", {"reference": stats(0.5, 0.1), "candidate": stats(0.5, 0.05), "measurements": 2}),
            row("cached", {"reference": stats(0.1, 0.1), "candidate": stats(9.0, 0.05)}, cached=True),
            row("cpu", {"reference": stats(1.0, 0.1, "cpu_wall"), "candidate": stats(9.0, 0.1, "cpu_wall")}),
            row("untimed", None)]
    run = tmp_path / "gpu_run"
    run.mkdir()
    (run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text("{}")
    report = write_report([run], tmp_path / "out", paper=False)
    assert table(report.out, "timing") == [{"run": "gpu_run", "timed on the GPU": "4", "measured again": "2",
                                            "candidate's median slow": "2", "reference's median slow": "1",
                                            "candidate's calls": "10", "slow calls": "4", "slow, host blocked": "2",
                                            "slow, allocating": "2"}]
    assert '<h2 id="timing">How steady the GPU timings were</h2>' in report.html.read_text()  # the page shows it too
    write_report([DATA / "bench_examples"], tmp_path / "cpu_only", paper=False)  # no GPU timings: no table
    assert not (tmp_path / "cpu_only" / "tables" / "timing.csv").exists()
