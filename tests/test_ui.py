"""The pages: ``/ui`` (run a session by hand) and ``/docs`` (Swagger UI), driven in a real headless
Chromium (Debian's ``chromium``; .ci/run installs it) by Playwright against ``edgecut serve``.
Without Chromium the browser tests skip with the reason. Every request the browser makes is
checked to stay on the service: the pages must work on a machine with no network.

Screenshots go to ``$EDGECUT_SCREENSHOT_DIR`` (``docs`` refreshes the README's) or the test's
temporary directory."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests
import yaml

from live_server import EdgecutServe

ROOT = Path(__file__).resolve().parent.parent
TRIAGE = json.loads((ROOT / "examples" / "triage" / "instance.json").read_text())
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
API_KEY = "ui-test-key-0123456789abcdef"

browser_needed = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium; .ci/run does)")


def acceptable_results(hypothesis: dict) -> set[str]:
    """What a session may end on when this hypothesis is the truth, from the wire form: its
    class, or on a decision instance the decisions it accepts (or those of least loss)."""
    if "acceptable" in hypothesis:
        return set(hypothesis["acceptable"])
    if "loss" in hypothesis:
        least = min(hypothesis["loss"].values())
        tolerance = TRIAGE.get("loss_tolerance", 0)
        return {d for d, loss in hypothesis["loss"].items() if loss <= least + tolerance}
    return {hypothesis.get("class", hypothesis["id"])}


def walk_tree(tree: dict, history: list[dict]) -> str:
    """The id of the policy-tree node a session with this history is at."""
    node = tree["root"]
    for entry in history:
        assert node.get("test") == entry["test"], "the session left the policy's tree"
        node = next(b["node"] for b in node["branches"] if b["outcome"] == entry["outcome"])
    return node["id"]


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def open_page(browser, served):
    """A fresh browser context per test; every request it makes must go to the service."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    outside: list[str] = []
    problems: list[str] = []

    def only_the_service(route):
        host = urlparse(route.request.url).hostname
        if route.request.url.startswith("data:") or host == "127.0.0.1":
            return route.continue_()
        outside.append(route.request.url)
        return route.abort()

    context.route("**/*", only_the_service)
    page = context.new_page()
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    yield page
    context.close()
    assert outside == [], f"the page tried to reach the network: {outside}"
    # The browser logs every 4xx as "Failed to load resource"; the tests look for those on the page.
    assert [p for p in problems if not p.startswith("Failed to load resource")] == [], problems


def screenshot_dir(tmp_path: Path) -> Path:
    return Path(os.environ.get("EDGECUT_SCREENSHOT_DIR") or tmp_path)


def answer_until_stopped(page, answers: dict[str, str], on_first_step=None) -> None:
    for step in range(len(answers) + 1):
        page.wait_for_selector("#next:not([hidden]), #stop-banner:not([hidden])")
        if page.is_visible("#stop-banner"):
            return
        if step == 0 and on_first_step is not None:
            on_first_step()
        test = page.text_content("#next-test")
        answered = page.locator("#history li").count()
        page.click(f'#outcomes button[data-outcome="{answers[test]}"]')
        page.wait_for_function("n => document.querySelectorAll('#history li').length > n", arg=answered)
    raise AssertionError("the session never stopped")


@browser_needed
@pytest.mark.parametrize("truth", ["appendicitis", "migraine"])
def test_a_triage_session_by_hand(open_page, served, tmp_path, truth):
    page = open_page
    hypothesis = next(h for h in TRIAGE["hypotheses"] if h["id"] == truth)
    page.goto(served.url + "/ui")
    assert page.locator("#examples label:has(input:checked)").inner_text().startswith("Triage")
    page.get_by_role("button", name="Use example").click()

    def why_this_test():
        # The first candidate is the test asked; each has a score and a cost.
        page.wait_for_selector("#why:not([hidden]) #candidates tr")
        rows = page.locator("#candidates tr")
        assert rows.first.locator("td").first.inner_text() == page.text_content("#next-test")
        assert "chosen" in (rows.first.get_attribute("class") or "")
        if truth == "appendicitis":
            page.wait_for_selector("#tree g.node.current")
            page.screenshot(path=str(screenshot_dir(tmp_path) / "ui-question.png"))

    answer_until_stopped(page, hypothesis["outcomes"], why_this_test)

    banner = page.locator("#stop-banner")
    assert banner.is_visible()
    text = banner.inner_text()
    assert text.startswith("Session stopped:")
    if "decisions" in TRIAGE:
        assert "decided" in text and "a decision is settled" in text
    else:
        assert "determined" in text and "the class is settled" in text
    result = text.split("Result: ")[1].split(" (")[0].split(" ", 1)[1]  # "decision gp_48h" → gp_48h
    assert result in acceptable_results(hypothesis)
    if "decisions" in TRIAGE:
        assert page.get_attribute("#recommendation .decision", "data-decision") == result
        row = page.locator(f'#posterior .bar-row[data-label="{result}"]')
    else:
        row = page.locator("#posterior .bar-row.top")
        assert row.get_attribute("data-label") == result
    assert row.locator(".bar-value").inner_text() == "100.0%"
    assert not page.is_visible("#next")

    # The page shows what the API holds, and the highlighted node is where that history leads.
    session_id = page.text_content("#session-id")
    state = requests.get(f"{served.url}/v1/sessions/{session_id}", timeout=5).json()
    assert state["done"] and [f"{h['test']}: {h['outcome']}" for h in state["history"]] == \
        [li.split(" cost")[0] for li in page.locator("#history li").all_inner_texts()]
    if shutil.which("dot") is not None:
        page.wait_for_selector("#tree g.node.current")
        # Posting the instance again is harmless (stored under its content hash) and names it.
        instance_id = requests.post(f"{served.url}/v1/instances", json=TRIAGE, timeout=5).json()["instance_id"]
        tree = requests.get(f"{served.url}/v1/instances/{instance_id}/tree", params={"policy": state["policy"]},
                            timeout=10).json()
        current = page.locator("#tree g.node.current title").text_content()
        assert current == walk_tree(tree, state["history"])
    if truth == "appendicitis":
        page.screenshot(path=str(screenshot_dir(tmp_path) / "ui.png"), full_page=True)


@browser_needed
def test_the_api_key_is_asked_for_and_kept_for_the_tab_only(browser, tmp_path):
    server = EdgecutServe({"REDIS_URL": "", "LOG_LEVEL": "warning", "API_KEYS": f"clinic:{API_KEY}"})
    server.wait_ready()
    try:
        context = browser.new_context()
        page = context.new_page()
        page.goto(server.url + "/ui")
        page.get_by_role("button", name="Use example").click()
        error = page.locator("#error")
        error.wait_for(state="visible")
        assert "401" in error.inner_text() and "API key" in error.inner_text()
        page.fill("#api-key", API_KEY)
        page.dispatch_event("#api-key", "change")
        page.get_by_role("button", name="Use example").click()
        page.wait_for_selector("#next:not([hidden])")
        assert not error.is_visible()
        assert page.evaluate("sessionStorage.getItem('edgecut.apiKey')") == API_KEY
        assert page.evaluate("localStorage.length") == 0 and "clinic" not in page.evaluate("document.cookie")
        # A new tab (a new session storage) starts without the key.
        other = context.new_page()
        other.goto(server.url + "/ui")
        assert other.input_value("#api-key") == ""
        context.close()
    finally:
        server.stop()


@browser_needed
def test_pasted_json_is_posted_and_its_problems_shown(open_page, served):
    page = open_page
    page.goto(served.url + "/ui")
    broken = {"tests": [{"id": "a", "cost": -1}], "hypotheses": [{"id": "h", "outcomes": {"a": "x"}}]}
    page.fill("#instance-json", json.dumps(broken))
    page.get_by_role("button", name="Post instance").click()
    page.locator("#error").wait_for(state="visible")
    assert "422" in page.text_content("#error-title") and "tests[0].cost" in page.text_content("#error-list")
    small = {"tests": [{"id": "q", "outcomes": ["no", "yes"]}],
             "hypotheses": [{"id": "h1", "class": "A", "outcomes": {"q": "no"}},
                            {"id": "h2", "class": "B", "outcomes": {"q": "yes"}}]}
    page.fill("#instance-json", json.dumps(small))
    page.get_by_role("button", name="Post instance").click()
    page.wait_for_selector("#next:not([hidden])")
    assert not page.is_visible("#error")
    assert "2 hypotheses, 1 test, 2 classes." in page.text_content("#instance-summary")
    page.click('#outcomes button[data-outcome="yes"]')
    page.wait_for_selector("#stop-banner:not([hidden])")
    assert "Result: class B" in page.text_content("#stop-banner")
    assert "1 hypothesis still possible" in page.text_content("#stats")


@browser_needed
def test_display_text_is_shown_and_the_label_posted(open_page, served):
    page = open_page
    page.goto(served.url + "/ui")
    worded = {"tests": [{"id": "q", "outcomes": ["no", "yes"], "text": "Any <b>fever</b>?",
                         "outcome_text": {"yes": "Yes, since this morning"}}],
              "hypotheses": [{"id": "h1", "class": "A", "outcomes": {"q": "no"}},
                             {"id": "h2", "class": "B", "outcomes": {"q": "yes"}}]}
    page.fill("#instance-json", json.dumps(worded))
    page.get_by_role("button", name="Post instance").click()
    page.wait_for_selector("#next:not([hidden])")
    assert page.text_content("#next-test") == "q"
    assert page.text_content("#next-text") == "Any <b>fever</b>?"  # text, never markup
    assert [page.text_content(f'#outcomes button[data-outcome="{label}"]') for label in ("no", "yes")] == \
        ["no", "Yes, since this morning"]
    page.click('#outcomes button[data-outcome="yes"]')
    page.wait_for_selector("#stop-banner:not([hidden])")
    assert "Result: class B" in page.text_content("#stop-banner")


def start_the_triage_example(page, url: str) -> dict:
    """Start a session on the shipped triage example; return its state as the API holds it."""
    page.goto(url + "/ui")
    page.get_by_role("button", name="Use example").click()
    page.wait_for_selector("#next:not([hidden])")
    return requests.get(f"{url}/v1/sessions/{page.text_content('#session-id')}", timeout=5).json()


@browser_needed
def test_the_decision_panel_says_what_it_recommends_and_why(open_page, served, tmp_path):
    page = open_page
    state = start_the_triage_example(page, served.url)
    decision = state["decision"]
    # The least expected loss is not the most probably acceptable decision here, which is why the
    # page must say which rule picked it.
    most_probable = max(state["decision_posterior"], key=state["decision_posterior"].get)
    assert decision["id"] != most_probable
    box = page.locator("#recommendation")
    assert box.is_visible()
    assert page.get_attribute("#recommendation .decision", "data-decision") == decision["id"]
    loss = format(decision["expected_loss"], ".3g")  # as the page rounds it
    assert f"The least expected loss of the {len(TRIAGE['decisions'])} decisions: {loss} " in box.inner_text()
    assert f"Acceptable with probability {100 * decision['probability']:.1f}%" in box.inner_text()
    # The bars are the probabilities alone, none singled out, in the API's order, labels whole.
    rows = page.locator("#posterior .bar-row")
    assert [r.get_attribute("data-label") for r in rows.all()] == list(state["decision_posterior"])
    assert page.locator("#posterior .bar-row.top").count() == 0
    for label, p in state["decision_posterior"].items():
        row = page.locator(f'#posterior .bar-row[data-label="{label}"]')
        assert row.locator(".bar-value").inner_text() == f"{100 * p:.1f}%"
    cut = page.evaluate("[...document.querySelectorAll('#posterior .bar-label')]"
                        ".filter(e => e.scrollWidth > e.clientWidth).map(e => e.textContent)")
    assert cut == []
    page.locator("#session-panel").screenshot(path=str(screenshot_dir(tmp_path) / "ui-decision.png"))


@browser_needed
def test_a_refused_paste_leaves_only_the_error(open_page, served, tmp_path):
    page = open_page
    start_the_triage_example(page, served.url)
    assert page.is_visible("#session-area") and page.is_visible("#instance-summary")
    page.fill("#instance-json", '{"tests": [], "hypotheses": []}')
    page.get_by_role("button", name="Post instance").click()
    page.locator("#error").wait_for(state="visible")
    assert "422" in page.text_content("#error-title")
    # The previous instance's summary, session form and session are gone, not left under the error.
    assert not page.is_visible("#session-area") and not page.is_visible("#instance-summary")
    assert not page.is_visible("#session-form")
    page.screenshot(path=str(screenshot_dir(tmp_path) / "ui-refused.png"))


@browser_needed
def test_a_phone_wide_page_fits_its_width(browser, served, tmp_path):
    context = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=1)
    page = context.new_page()
    try:
        overflow = ("[...document.querySelectorAll('input, select, textarea, button, label, .panel')]"
                    ".filter(e => e.offsetParent !== null && e.getBoundingClientRect().right > 390)"
                    ".map(e => e.id || e.outerHTML.slice(0, 60))")
        page.goto(served.url + "/ui")
        assert page.evaluate(overflow) == []
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.get_by_role("button", name="Use example").click()
        page.wait_for_selector("#next:not([hidden])")
        assert page.evaluate(overflow) == []
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.screenshot(path=str(screenshot_dir(tmp_path) / "ui-phone.png"), full_page=True)
    finally:
        context.close()


@browser_needed
def test_every_example_title_is_shown_whole(open_page, served):
    from service import ui

    page = open_page
    page.goto(served.url + "/ui")
    shown = page.locator("#examples label").all_inner_texts()
    assert [text.strip() for text in shown] == list(ui.examples().values())
    cut = page.evaluate("[...document.querySelectorAll('#examples label span')]"
                        ".filter(e => e.scrollWidth > e.clientWidth).length")
    assert cut == 0


@browser_needed
def test_docs_render_every_operation_offline(open_page, served):
    page = open_page
    page.goto(served.url + "/docs/")
    page.wait_for_selector(".opblock")
    spec = yaml.safe_load(requests.get(served.url + "/openapi.yaml", timeout=5).text)
    operations = {(method.upper(), path) for path, item in spec["paths"].items() for method in item
                  if method in ("get", "post", "put", "delete", "patch")}
    shown = {(block.locator(".opblock-summary-method").inner_text().strip(),
              block.locator(".opblock-summary-path").get_attribute("data-path"))
             for block in page.locator(".opblock").all()}
    assert shown == operations
    assert page.locator(".info .title").inner_text().startswith(spec["info"]["title"])


# --- without a browser --------------------------------------------------------------------------


@pytest.fixture
def web(tmp_path):
    from service.app import create_app

    return create_app({"redis_url": None}).test_client()


def test_every_shipped_example_is_a_valid_instance(web):
    from schemas.instance import Instance
    from service import ui

    assert "triage" in ui.examples()
    for name in ui.examples():
        response = web.get(f"/ui/examples/{name}.json")
        assert response.status_code == 200
        assert response.get_json() == json.loads((ROOT / "examples" / name / "instance.json").read_text())
        Instance.model_validate(response.get_json())
    for bad in ("nope", "..%2fpyproject", "TRIAGE"):
        assert web.get(f"/ui/examples/{bad}.json").status_code == 404


def test_the_page_and_the_docs_are_served_from_the_package(web):
    page = web.get("/ui")
    assert page.status_code == 200 and "text/html" in page.content_type
    assert web.get("/ui/").status_code == 200 and web.get("/docs").status_code == 308
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]  # the browser tests run under it
    html = page.get_data(as_text=True)
    assert "https://" not in html.replace("http://www.w3.org", "") and "//cdn" not in html
    for asset in ("/ui/static/ui.js", "/ui/static/ui.css", "/docs/swagger-ui-bundle.js", "/docs/swagger-ui.css"):
        assert web.get(asset).status_code == 200, asset
    docs = web.get("/docs/").get_data(as_text=True)
    assert '"url": "/openapi.yaml"' in docs and '"validatorUrl": null' in docs


def test_buttons_follow_what_the_served_contract_offers(monkeypatch):
    from service import ui

    spec = yaml.safe_load((ROOT / "service" / "openapi.yaml").read_text())
    ui.features.cache_clear()
    try:
        assert ui.features() == {"skip": True, "corrections": True}
        # The same contract without skip and corrections, as an older version of the API serves it.
        for name in ("ObservationIn", "ObservationsRequest"):
            del spec["components"]["schemas"][name]["properties"]["skip"]
            del spec["components"]["schemas"][name]["oneOf"]  # the answer-or-skip forms
        del spec["paths"]["/v1/sessions/{session_id}/observations/{test}"]
        monkeypatch.setattr("service.api.health.openapi_text", lambda: yaml.safe_dump(spec).encode())
        ui.features.cache_clear()
        assert ui.features() == {"skip": False, "corrections": False}
    finally:
        ui.features.cache_clear()


@pytest.fixture
def in_process(monkeypatch):
    """The app served from a thread of the test process, so the test can change what it says it
    offers (the contract of a later API version) without another process."""
    import threading

    from werkzeug.serving import make_server

    from service import ui
    from service.app import create_app

    monkeypatch.setattr(ui, "features", lambda: {"skip": True, "corrections": True})
    server = make_server("127.0.0.1", 0, create_app({"redis_url": None}), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(timeout=5)


@browser_needed
def test_skip_undo_and_decision_states_where_the_api_offers_them(browser, in_process):
    """With skip and corrections in the contract the page shows their buttons and sends the
    documented requests (answered here by the test, as the API that has them would), and it
    shows a decision posterior when a state carries one."""
    context = browser.new_context()
    page = context.new_page()
    sent: list[tuple[str, str, object, str | None]] = []

    def answer_as_a_later_api(route):
        request = route.request
        sent.append((request.method, urlparse(request.url).path, request.post_data_json, request.headers.get("if-match")))
        state = requests.get(in_process + urlparse(request.url).path.split("/observations")[0], timeout=5).json()
        if request.method == "POST":
            state["history"] = [{"test": request.post_data_json["test"], "skipped": True, "cost": 0.0}]
            state.update(step=1, done=True, stop_reason="decided", next_test=None, candidates=None,
                         decision={"id": "urgent-care", "probability": 1.0},
                         decision_posterior={"urgent-care": 1.0, "emergency": 0.25})
        route.fulfill(status=200, json=state, headers={"ETag": '"2"' if request.method == "POST" else '"3"'})

    page.route("**/observations**", answer_as_a_later_api)
    page.goto(in_process + "/ui")
    page.get_by_role("button", name="Use example").click()
    page.wait_for_selector("#next:not([hidden])")
    first = page.text_content("#next-test")
    page.get_by_role("button", name="Skip").click()
    page.wait_for_selector("#stop-banner:not([hidden])")
    assert sent[0][0] == "POST" and sent[0][2] == {"test": first, "skip": True} and sent[0][3] == '"1"'
    assert page.locator("#history li").first.inner_text().startswith(f"{first}: skipped")
    assert page.text_content("#posterior-title") == "Probability each decision is acceptable"
    assert page.get_attribute("#recommendation .decision", "data-decision") == "urgent-care"
    assert "most likely to be acceptable (the instance gives no losses)" in page.text_content("#recommendation")
    assert page.locator("#posterior .bar-row.top").count() == 0
    assert "Result: decision urgent-care" in page.text_content("#stop-banner")
    assert "a decision is settled" in page.text_content("#stop-banner")
    page.get_by_role("button", name="Undo").click()
    page.wait_for_selector("#next:not([hidden])")
    assert sent[1][:2] == ("DELETE", f"/v1/sessions/{page.text_content('#session-id')}/observations/{first}")
    assert sent[1][3] == '"2"'
    context.close()
