"""The chat page at work in a real browser: headless Chromium (Debian's)
driven by Playwright. A message is sent and its reply streams in, a reply
is stopped, a reload finds the conversation, a refusal is shown as one.

SmolLM2 does not think or call tools, so the thought and the tool call are
shown with the thinking test model (tests/thinking_model.py) steered by a
grammar the test adds to the page's request on its way out: the server's
stream is real, its words are the grammar's.

A screenshot of each page is saved under $EMBER_WEBUI_SCREENSHOTS (default:
the test's temporary folder), never in the repository."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from server_process import ServerProcess, http, sse

playwright_api = pytest.importorskip("playwright.sync_api", reason="Playwright is in the test extras")

CHROMIUM = next((p for p in ("/usr/lib/chromium/chromium", shutil.which("chromium") or "",
                             shutil.which("chromium-browser") or "") if p and Path(p).exists()), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium package is not installed")

TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = Path(os.environ.get("EMBER_WEBUI_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def smol(smollm2_path):
    with ServerProcess(smollm2_path, "-n", "400") as s:
        yield s


@pytest.fixture
def page(browser):
    context = browser.new_context()
    p = context.new_page()
    p.set_default_timeout(TIMEOUT_MS)
    yield p
    context.close()


def _send(page, text: str) -> None:
    page.fill("#input", text)
    page.click("#send")


def test_a_message_streams_its_reply_and_a_reload_finds_the_conversation(page, smol, shots):
    page.goto(smol.url + "/")
    page.locator("#model-name", has_text="Smollm2").wait_for()
    page.click("#settings-toggle")
    assert page.is_hidden("#thinking-row"), "SmolLM2's template has no thinking switch"
    page.fill("#max-tokens", "24")
    page.fill("#temperature", "0")
    _send(page, "What is the capital of France?")
    # Streamed: the stop button shows while the reply grows, then the rate is shown.
    page.wait_for_selector(".message.assistant .stats")
    reply = page.inner_text(".message.assistant .body")
    assert reply.strip(), "the reply has text"
    assert "tokens/s" in page.inner_text(".message.assistant .stats")
    assert page.is_hidden("#stop") and page.is_visible("#send")
    assert page.inner_text("#conversations li") .startswith("What is the capital of France?")
    page.screenshot(path=str(shots / "chat.png"), full_page=True)

    page.reload()
    page.wait_for_selector(".message.assistant")
    assert page.inner_text(".message.user .body") == "What is the capital of France?"
    assert page.inner_text(".message.assistant .body") == reply
    # A second conversation, and the list keeps both.
    page.click("#new-chat")
    assert page.locator(".message").count() == 0
    _send(page, "Say hello.")
    page.wait_for_selector(".message.assistant .stats")
    assert page.locator("#conversations li").count() == 2
    page.locator("#conversations li button.open", has_text="What is the capital").click()
    assert page.inner_text(".message.user .body") == "What is the capital of France?"


def test_a_reply_is_stopped_and_says_so(page, smol, shots):
    page.goto(smol.url + "/")
    page.click("#settings-toggle")
    page.fill("#max-tokens", "400")
    page.fill("#temperature", "0.8")
    _send(page, "Write a long story about a lighthouse keeper.")
    # (No wait_for_function: the page's policy forbids evaluating strings, and the test keeps the policy on.)
    page.locator(".message.assistant .body", has_text=re.compile(r"\S(.*\S){20}", re.S)).wait_for()
    page.click("#stop")
    page.wait_for_selector(".message.assistant .stats")
    assert "stopped" in page.inner_text(".message.assistant .stats")
    assert page.is_visible("#send")
    # The reply's stream is kept for a reload, so leaving does not end it: the stop is said.
    assert smol.saw("stopped (DELETE /v1/stream)"), "the server was told to stop the reply"
    page.screenshot(path=str(shots / "stopped.png"), full_page=True)


def test_a_reply_cut_by_a_reload_is_read_again_from_the_server(page, smol, shots):
    question = "What is the capital of France?"
    # A reply the server kept under a conversation's id, as the page asks it to.
    status, _, raw = http(smol.url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": question}], "stream": True, "max_tokens": 24, "temperature": 0},
        headers={"X-Conversation-Id": "reloaded"})
    assert status == 200
    want = "".join(e["choices"][0]["delta"].get("content") or "" for e in sse(raw)[:-1] if e["choices"])
    # The page closed while it read the reply (done false), and a second reply the server no longer has.
    convs = [{"id": cid, "title": cid, "updated": 1, "messages": [
        {"role": "user", "content": question}, {"role": "assistant", "content": "The cap", "reasoning": "",
                                                "done": False}]} for cid in ("forgotten", "reloaded")]
    page.goto(smol.url + "/")
    page.evaluate("([convs]) => { localStorage.setItem('ember.conversations', JSON.stringify(convs));"
                  " localStorage.setItem('ember.current', 'reloaded'); }", [convs])
    page.reload()
    page.wait_for_selector(".message.assistant .stats")
    assert " ".join(page.inner_text(".message.assistant .body").split()) == " ".join(want.split())
    assert page.is_hidden("#stop")
    page.screenshot(path=str(shots / "resumed.png"), full_page=True)
    page.locator("#conversations li button.open", has_text="forgotten").click()
    assert "cut off when the page closed" in page.inner_text(".message.assistant")
    # A reply the page sends is kept under its conversation's id.
    page.click("#new-chat")
    _send(page, "Say hello.")
    page.wait_for_selector(".message.assistant .stats")
    conv_id = page.evaluate("() => localStorage.getItem('ember.current')")
    found = json.loads(http(smol.url + "/v1/streams/lookup", {"conversation_ids": [conv_id]})[2])
    assert [(f["conversation_id"], f["is_done"]) for f in found] == [(conv_id, True)]


def test_a_refusal_is_shown_as_one(page, smol, shots):
    page.goto(smol.url + "/")
    page.click("#settings-toggle")
    page.fill("#temperature", "-1")
    _send(page, "hello")
    page.wait_for_selector("#error:not([hidden])")
    shown = page.inner_text("#error")
    assert shown.startswith("The server refused the request: 400") and "temperature" in shown, shown
    page.screenshot(path=str(shots / "refused.png"), full_page=True)


def test_an_api_key_is_sent_and_a_wrong_one_is_shown_as_refused(page, smollm2_path):
    with ServerProcess(smollm2_path, "--api-key", "sekrit", "-n", "8") as s:
        page.goto(s.url + "/")
        page.click("#settings-toggle")
        page.fill("#api-key", "wrong")
        _send(page, "hello")
        page.wait_for_selector("#error:not([hidden])")
        assert page.inner_text("#error").startswith("The server refused the request: 401")
        page.fill("#api-key", "sekrit")
        page.click("#new-chat")
        _send(page, "hello")
        page.wait_for_selector(".message.assistant .stats")
        assert page.is_hidden("#error")


def test_the_thought_is_shown_apart_and_folds_and_calls_are_shown_as_calls(page, tmp_path, shots):
    import thinking_model

    with thinking_model.serving(tmp_path) as s:
        def steer(route, grammar):
            body = json.loads(route.request.post_data)
            route.continue_(post_data=json.dumps({**body, "grammar": grammar}))

        page.goto(s.url + "/")
        # The switch is offered: the template reads enable_thinking.
        page.wait_for_selector("#thinking-row:not([hidden])", state="attached")
        page.route("**/v1/chat/completions", lambda route: steer(route, thinking_model.STEERED))
        _send(page, "Think first.")
        page.wait_for_selector(".message.assistant .stats")
        thought = page.locator(".message.assistant details.thought")
        assert thought.locator(".text").text_content().startswith("Let me think")
        assert not thought.evaluate("d => d.open"), "a finished thought is folded"
        assert page.inner_text(".message.assistant .body").startswith("The answer")
        thought.locator("summary").click()
        assert thought.evaluate("d => d.open")
        page.screenshot(path=str(shots / "thought.png"), full_page=True)

        page.unroute("**/v1/chat/completions")
        call = r'''root ::= "Let me think\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"'''

        def with_tools(route):
            body = json.loads(route.request.post_data)
            tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}}}}}]
            route.continue_(post_data=json.dumps({**body, "tools": tools, "grammar": call}))

        page.route("**/v1/chat/completions", with_tools)
        page.click("#new-chat")
        _send(page, "Weather in Paris?")
        page.wait_for_selector(".message.assistant .tool-call")
        assert page.inner_text(".message.assistant .tool-call") == 'call get_weather({"city": "Paris"})'
        page.screenshot(path=str(shots / "tool-call.png"), full_page=True)


def test_markup_in_a_reply_is_shown_not_run(page, smol):
    """A reply is the model's text and may hold anything: a recorded stream
    (the route's shape, fulfilled by the test) carrying markup that would run
    script is rendered inert."""
    hostile = ('Look: <img src=x onerror="window.pwned=1"> <script>window.pwned=2</script> '
               '[link](javascript:window.pwned=3) **bold**')
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": hostile}}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
               "timings": {"predicted_per_second": 12.5}}]
    stream = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    page.goto(smol.url + "/")
    page.route("**/v1/chat/completions",
               lambda route: route.fulfill(status=200, body=stream, content_type="text/event-stream"))
    _send(page, "hello")
    page.wait_for_selector(".message.assistant .stats")
    page.locator(".message.assistant .body a").click() if page.locator(".message.assistant .body a").count() else None
    assert page.evaluate("window.pwned") is None
    assert page.locator(".message.assistant .body script").count() == 0
    assert page.locator(".message.assistant .body img[onerror]").count() == 0
    assert page.inner_text(".message.assistant .body strong") == "bold"
    assert "12.5 tokens/s" in page.inner_text(".message.assistant .stats")


def test_below_an_api_prefix_the_page_loads_its_files_and_talks_to_its_routes(page, smollm2_path):
    """--api-prefix: the page at PREFIX/ fetches its scripts, /props and the
    chat route below the prefix; nothing it asks for lies outside it."""
    with ServerProcess(smollm2_path, "-n", "400", "--api-prefix", "/chat/ui") as s:
        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url))
        page.goto(s.url + "/")
        page.locator("#model-name", has_text="Smollm2").wait_for()
        page.click("#settings-toggle")
        page.fill("#max-tokens", "8")
        _send(page, "Hello?")
        page.wait_for_selector(".message.assistant .stats")
        assert page.inner_text(".message.assistant .body").strip()
    assert any(u.endswith("/chat/ui/webui/app.js") for u in asked)
    assert any(u.endswith("/chat/ui/v1/chat/completions") for u in asked)
    assert all(u.startswith(s.url + "/") for u in asked if u.startswith(s.root)), asked
