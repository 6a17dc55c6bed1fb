"""The dashboard in a real headless Chromium (Debian's, driven by Playwright): the live page while evaluations run,
the table's filters, one evaluation's page (reasons, timing plot), a candidate's `<script>` shown as text, named
clients kept apart, and bench run folders browsed through `drkernel report --serve`'s app.

Evaluations are real: the examples on the CPU under Triton's interpreter, through a one-worker scheduler. Screenshots
go to results/dashboard/ (git-ignored).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from drkernel.scheduling.scheduler import Scheduler
from drkernel.service.app import create_app
from drkernel.service.dispatcher import Dispatcher
from drkernel.service.store import Store
from tests.test_scheduler import REPO, example, stalled
from tests.test_service_api import TOKEN, serving_app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
SHOTS = REPO / "results" / "dashboard"
CLIENTS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab"}
TIMED = {"measure_performance": True, "perf_trials": 8, "warmup_trials": 1, "profile": True}
SCRIPT = "<script>window.__injected = 1; document.title = 'injected';</script>"
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = Store(tmp_path_factory.mktemp("dashboard") / "store.db")
    dispatcher = Dispatcher(store, Scheduler("cpu", workers=1), "cpu")
    with serving_app(create_app(dispatcher, TOKEN, CLIENTS)) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.errors = []
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    yield page
    context.close()


def submit(url: str, token: str, pairs: list[tuple[str, str]], task_prefix: str = "", prefix: str = "",
           **options: Any) -> list[str]:
    items = []
    for task, candidate in pairs:
        request, _ = example(task, candidate, prefix, **options)
        items.append({"reference": request.reference, "candidate": request.candidate,
                      "options": request.options.to_dict(), "task_name": task_prefix + task})
    answer = httpx.post(f"{url}/v1/evaluations", json={"items": items}, headers=auth(token), timeout=30)
    answer.raise_for_status()
    return answer.json()["ids"]


def wait_done(url: str, token: str, ids: list[str]) -> list[dict[str, Any]]:
    results = []
    for id in ids:
        answer = httpx.get(f"{url}/v1/evaluations/{id}", params={"wait": 60}, headers=auth(token), timeout=90)
        assert answer.json()["state"] == "done", answer.text
        results.append(answer.json()["result"])
    return results


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def sign_in(page: Any, url: str, token: str, path: str = "/dashboard") -> None:
    """Open a page once with ?token=: the server trades it for the cookie and drops it from the address."""
    page.goto(f"{url}{path}?token={token}")
    assert "token=" not in page.url


def rows(page: Any) -> list[dict[str, str]]:
    return page.eval_on_selector_all("#rows tbody tr", """trs => trs.map(tr => ({
        status: tr.cells[1].textContent, task: tr.cells[2].textContent, group: tr.cells[3].textContent,
        reasons: tr.cells[4].textContent}))""")


def polls(page: Any) -> int:
    """How many answers of /dashboard/data the page has drawn (its script counts them on <body>)."""
    return int(page.evaluate("Number(document.body.dataset.polls || 0)"))


def polled_after(page: Any, before: int, timeout: float = 15) -> None:
    """Wait for the page to draw a newer answer. (Playwright's wait_for_function evaluates its predicate with
    eval, which the pages' Content-Security-Policy forbids; `evaluate` goes through the DevTools protocol.)"""
    deadline = time.monotonic() + timeout
    while polls(page) <= before:
        assert time.monotonic() < deadline, "the page drew no new answer"
        page.wait_for_timeout(50)


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_the_live_page_updates_while_evaluations_run(service: str, page: Any) -> None:
    sign_in(page, service, TOKEN)
    polled_after(page, 0)
    seen_done = int(page.text_content("#done"))
    pairs = [("1_vector_add", "1_vector_add__triton"), ("2_relu", "2_relu__wrong"),
             ("2_relu", "2_relu__pytorch_only"), ("5_layernorm", "5_layernorm__raises")] * 2
    # the first one stalls 3 s on the only worker: the rest wait behind it, long enough for polls to see them
    ids = submit(service, TOKEN, pairs[:1], prefix=stalled(3), seed=7) + submit(service, TOKEN, pairs, seed=7)
    waiting, deadline = set(), time.monotonic() + 120
    while int(page.text_content("#done")) < seen_done + len(ids):  # the page, not the API, says when all are done
        assert time.monotonic() < deadline, page.text_content("#live")
        waiting.add(int(page.text_content("#queued")) + int(page.text_content("#running")))
        page.wait_for_timeout(200)
    assert max(waiting) > 0, "the page never showed the batch queued or running"
    polled_after(page, polls(page))
    assert int(page.text_content("#hour-total")) >= len(ids)
    assert page.locator("#rate-chart rect").count() >= 1 and page.locator("#status-chart rect.hacked").count() >= 1
    assert "no_triton_kernel" in page.text_content("#reasons")
    worker = page.eval_on_selector_all("#workers tbody td", "tds => tds.map(td => td.textContent)")
    assert worker[:2] == ["cpu0", "cpu"] and int(worker[5]) >= 5  # it ran the 5 distinct requests
    assert page.text_content("#hit-rate").endswith("%")  # the second half of the batch repeats the first: hits
    listed = rows(page)
    assert {r["status"] for r in listed} >= {"correct", "incorrect", "hacked", "runtime_error"}
    assert not page.errors
    shot(page, "live")


def test_the_table_filters_by_status_reason_task_and_client(service: str, page: Any) -> None:
    wait_done(service, CLIENTS["alice"], submit(service, CLIENTS["alice"], [("2_relu", "2_relu__pytorch_only"),
                                                                             ("2_relu", "2_relu__triton")], "alice/"))
    wait_done(service, CLIENTS["bob"], submit(service, CLIENTS["bob"], [("1_vector_add", "1_vector_add__triton")],
                                              "bob/"))
    sign_in(page, service, TOKEN)
    polled_after(page, 0)

    def filtered(**fields: str) -> list[dict[str, str]]:
        for name, value in fields.items():  # one at a time: each change asks for its own answer
            before = polls(page)
            if name in ("status", "reason"):
                page.select_option(f"#filters [name={name}]", value)
            else:
                page.fill(f"#filters [name={name}]", value)
            polled_after(page, before)
        return rows(page)

    hacked = filtered(status="hacked")
    assert hacked and all(r["status"] == "hacked" for r in hacked)
    assert "status=hacked" in page.url  # the filters are in the address: a filtered view can be shared
    assert all("no_triton_kernel" in r["reasons"] for r in filtered(status="", reason="no_triton_kernel"))
    assert {r["task"] for r in filtered(reason="", task="alice/")} == {"alice/2_relu"}
    shot(page, "filtered")
    by_bob = filtered(task="", client="bob")
    assert [(r["task"], r["group"]) for r in by_bob] == [("bob/1_vector_add", "bob")]
    assert filtered(client="nobody") == [] and page.is_visible("#no-rows")
    assert not page.errors


def test_a_client_sees_only_its_own_submissions(service: str, page: Any) -> None:
    (mine,) = submit(service, CLIENTS["alice"], [("2_relu", "2_relu__wrong")], "alice/")
    (theirs,) = submit(service, CLIENTS["bob"], [("2_relu", "2_relu__wrong")], "bob/")
    wait_done(service, CLIENTS["bob"], [theirs])
    sign_in(page, service, CLIENTS["alice"])
    polled_after(page, 0)
    page.fill("#filters [name=client]", "bob")  # asking for another client's rows shows one's own
    page.wait_for_timeout(2500)
    assert {r["group"] for r in rows(page)} == {"alice"}
    for path in (f"/dashboard/evaluations/{theirs}", f"/dashboard/evaluations/{theirs}/reference"):
        assert page.goto(service + path).status == 404
    assert page.goto(f"{service}/dashboard/evaluations/{mine}").status == 200
    assert httpx.get(f"{service}/v1/evaluations/{theirs}", headers=auth(CLIENTS["alice"])).status_code == 404
    # the cookie opens the dashboard only: it is no bearer token, and no cookie is sent to the API
    cookie = page.context.cookies()[0]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["value"] not in CLIENTS.values()
    assert httpx.get(f"{service}/v1/workers", headers=auth(cookie["value"])).status_code == 401
    assert httpx.get(f"{service}/dashboard/data").status_code == 401


def test_an_evaluation_page_shows_its_reasons_and_its_timing_plot(service: str, page: Any) -> None:
    hacked, timed = submit(service, TOKEN, [("2_relu", "2_relu__pytorch_only"), ("1_vector_add",
                                                                                 "1_vector_add__triton")], **TIMED)
    results = wait_done(service, TOKEN, [hacked, timed])
    sign_in(page, service, TOKEN, f"/dashboard/evaluations/{hacked}")
    assert page.text_content("#verdict") == "hacked"
    reasons = page.text_content("#reasons")
    for reason in results[0]["hack_reasons"]:
        assert reason in reasons and results[0]["hack_details"][reason][:40] in reasons
    shot(page, "hacked")
    page.goto(f"{service}/dashboard/evaluations/{timed}")
    assert page.text_content("#verdict") == "correct"
    assert page.locator("svg.timing-plot circle.reference").count() == TIMED["perf_trials"]
    assert page.locator("svg.timing-plot circle.candidate").count() == TIMED["perf_trials"]
    assert page.locator("svg.timing-plot").bounding_box()["width"] > 300  # drawn, not an empty box
    assert page.locator("#phases tr").count() == len(results[1]["phases_s"])
    assert "add_kernel" in page.text_content("#profile")  # launch counts: the CPU has no GPU time to split
    assert page.locator("#source .k").count() > 0  # highlighted: keywords in their own spans
    page.click("#task")
    assert "class Model" in page.text_content("pre.code")
    assert not page.errors
    page.go_back()
    shot(page, "timed")


def test_a_candidate_holding_a_script_is_shown_as_text(service: str, page: Any) -> None:
    request, _ = example("2_relu", "2_relu__triton")
    candidate = f"# {SCRIPT}\nBANNER = \"{SCRIPT}\"\n" + request.candidate
    answer = httpx.post(f"{service}/v1/evaluations", headers=auth(TOKEN), json={
        "reference": request.reference, "candidate": candidate, "options": request.options.to_dict(),
        "task_name": f"relu {SCRIPT}"})
    id = answer.json()["id"]
    wait_done(service, TOKEN, [id])
    sign_in(page, service, TOKEN, f"/dashboard/evaluations/{id}")
    assert page.evaluate("window.__injected") is None and page.title() != "injected"
    assert page.locator("script").count() == 0  # the evaluation page runs no script at all
    assert SCRIPT in page.text_content("#source") and SCRIPT in page.text_content("#task")
    page.goto(f"{service}/dashboard")  # the table lists the task name: as text too
    polled_after(page, 0)
    assert any(SCRIPT in r["task"] for r in rows(page))
    assert page.evaluate("window.__injected") is None and not page.errors
    page.goto(f"{service}/dashboard/evaluations/{id}")
    shot(page, "script-as-text")


def test_report_serve_browses_a_bench_run(service: str, page: Any, tmp_path: Path) -> None:
    """A bench run folder (trajectories.jsonl lines with real results) on the same evaluation page."""
    from drkernel.report.browse import create_app as browser_app

    pairs = [("2_relu", "2_relu__pytorch_only"), ("1_vector_add", "1_vector_add__triton")]
    results = wait_done(service, TOKEN, submit(service, TOKEN, pairs, **TIMED))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"tasks": str(REPO / "examples" / "tasks")}))
    lines = [{"task": task, "level": None, "sample": 0, "turn": 1, "messages": [], "response": "", "reward": 0.0,
              "code": example(task, candidate)[0].candidate, "result": result, "feedback": "", "context_turns": []}
             for (task, candidate), result in zip(pairs, results)]
    (run / "trajectories.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    with serving_app(browser_app([run], TOKEN)) as url:
        sign_in(page, url, TOKEN)
        polled_after(page, 0)
        assert page.locator("#live").count() == 0
        assert [r["status"] for r in rows(page)] == ["correct", "hacked"]  # newest first
        page.click("#rows tbody tr:nth-child(2) a")
        assert page.text_content("#verdict") == "hacked" and "no_triton_kernel" in page.text_content("#reasons")
        page.click("#task")
        assert "class Model" in page.text_content("pre.code")
        page.go_back()
        page.go_back()
        page.click("#rows tbody tr:nth-child(1) a")
        assert page.locator("svg.timing-plot circle").count() == 2 * TIMED["perf_trials"]
        shot(page, "report-serve")
        assert not page.errors
