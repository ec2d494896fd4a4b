"""The Responses API's store, through the official `openai` client: a chain
of replies by `previous_response_id` (the slot's cache reused), GET, DELETE,
the input items, background responses polled and cancelled, the bounds,
`store: false`, and each API key's responses its own."""

from __future__ import annotations

import time

import pytest

from api_helpers import openai_client
from server_process import ServerProcess, http

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path, "--responses-max", "3") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def test_a_chain_of_three_replies_continues_one_conversation(client, server):
    # Instructions are not carried on (as OpenAI's API has it): a client sends them with each turn.
    brief = "Answer in one short sentence."
    first = client.responses.create(model="m", instructions=brief, input="My name is Ada. Remember it.",
                                    max_output_tokens=16, temperature=0)
    assert first.store is True and first.status in ("completed", "incomplete")
    second = client.responses.create(model="m", instructions=brief, previous_response_id=first.id,
                                     input="What is the capital of France?", max_output_tokens=16, temperature=0)
    third = client.responses.create(model="m", instructions=brief, previous_response_id=second.id,
                                    input="What is my name?", max_output_tokens=16, temperature=0)
    assert third.previous_response_id == second.id
    # Each turn's prompt holds the one before it: the slot read only what was new.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    assert third.usage.input_tokens_details.cached_tokens >= second.usage.input_tokens
    # The chain is the conversation as a whole one would send it: the same prompt, the same answer.
    whole = client.responses.create(model="m", store=False, instructions=brief, input=[
        {"role": "user", "content": "My name is Ada. Remember it."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "What is my name?"}], max_output_tokens=16, temperature=0)
    assert whole.usage.input_tokens == third.usage.input_tokens and whole.output_text == third.output_text
    assert whole.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(whole.id)


def test_a_stored_response_is_read_listed_and_deleted(client):
    r = client.responses.create(model="m", input=[{"role": "user", "content": "Say hi."},
                                                  {"role": "user", "content": "Then say bye."}],
                                max_output_tokens=4, temperature=0)
    again = client.responses.retrieve(r.id)
    assert again.id == r.id and again.output_text == r.output_text and again.status == r.status
    items = client.responses.input_items.list(r.id)
    assert [i.content[0].text for i in items.data] == ["Then say bye.", "Say hi."], "newest first"
    asc = client.responses.input_items.list(r.id, order="asc", limit=1)
    assert [i.content[0].text for i in asc.data] == ["Say hi."] and asc.has_more
    after = client.responses.input_items.list(r.id, order="asc", after=asc.data[0].id)
    assert [i.content[0].text for i in after.data] == ["Then say bye."]
    # An item of a stored response may be sent again by reference.
    ref = client.responses.create(model="m", input=[{"type": "item_reference", "id": r.output[0].id},
                                                    {"role": "user", "content": "Again."}], max_output_tokens=4)
    assert ref.status in ("completed", "incomplete")
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="m", previous_response_id=r.id, input="x")


def test_background_responses_are_polled_and_cancelled(client):
    r = client.responses.create(model="m", input="Count to ten.", background=True, max_output_tokens=8)
    assert r.status in ("queued", "in_progress") and r.background
    for _ in range(600):
        r = client.responses.retrieve(r.id)
        if r.status not in ("queued", "in_progress"):
            break
        time.sleep(0.05)
    assert r.status in ("completed", "incomplete") and r.output_text
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(r.id)  # it has finished

    long = client.responses.create(model="m", input="Write a long story.", background=True,
                                   max_output_tokens=2000, temperature=0.8)
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(long.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input="x", background=True, store=False)
    assert e.value.body["param"] == "background"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.cancel(client.responses.create(model="m", input="hi", max_output_tokens=2).id)
    assert "not a background response" in e.value.body["message"]


def test_the_store_keeps_the_newest_within_its_bound(client):
    ids = [client.responses.create(model="m", input=f"Say {w}.", max_output_tokens=2).id
           for w in ("one", "two", "three", "four")]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[0])
    assert [client.responses.retrieve(i).id for i in ids[1:]] == ids[1:]


def test_bad_listings_name_their_field(server):
    r = http(server.url + "/v1/responses", {"input": "hi", "max_output_tokens": 2})
    rid = __import__("json").loads(r[2])["id"]
    for query, field in (("order=sideways", "order"), ("limit=0", "limit"), ("limit=x", "limit"),
                         ("after=nope", "after")):
        status, _, body = http(f"{server.url}/v1/responses/{rid}/input_items?{query}")
        assert status == 400 and __import__("json").loads(body)["error"]["param"] == field, (query, body)
    assert http(f"{server.url}/v1/responses/{rid}?stream=true")[0] == 400


def test_each_key_s_responses_are_its_own(smollm2_path):
    with ServerProcess(smollm2_path, "--api-key", "alice,bob") as s:
        alice = openai_client(s, "alice")
        bob = openai_client(s, "bob")
        r = alice.responses.create(model="m", input="A secret: 4711.", max_output_tokens=2)
        assert alice.responses.retrieve(r.id).id == r.id
        for attempt in (lambda: bob.responses.retrieve(r.id), lambda: bob.responses.delete(r.id),
                        lambda: bob.responses.input_items.list(r.id),
                        lambda: bob.responses.create(model="m", previous_response_id=r.id, input="What was it?")):
            with pytest.raises(openai.NotFoundError):
                attempt()
        assert alice.responses.retrieve(r.id).id == r.id


def test_no_store_refuses_what_needs_one(smollm2_path):
    with ServerProcess(smollm2_path, "--responses-max", "0") as s:
        c = openai_client(s)
        r = c.responses.create(model="m", input="hi", max_output_tokens=2)
        assert r.store is False
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model="m", input="hi", store=True)
        assert e.value.body["param"] == "store"


def test_the_store_s_bounds_and_refusals():
    """`ResponseStore` alone: past its count the oldest finished response
    goes; one still running is never dropped, and when only running ones
    could make room the new one is refused; one larger than the whole
    store is refused; another owner is told none exists."""
    from ember.server.errors import ApiError
    from ember.server.response_store import ResponseStore, Stored

    def entry(i: int, status: str = "completed", owner: int = 0) -> Stored:
        return Stored(id=f"resp_{i}", response={"status": status, "output": []}, input_items=[], owner=owner)

    store = ResponseStore(max_count=2, max_bytes=10_000)
    store.put(entry(1, "in_progress"))
    store.put(entry(2))
    store.put(entry(3))
    assert [store.get(f"resp_{i}", 0).id for i in (1, 3)] == ["resp_1", "resp_3"], "the finished one went"
    with pytest.raises(ApiError):
        store.get("resp_2", 0)
    store.put(entry(4, "in_progress"))
    with pytest.raises(ApiError) as full:
        store.put(entry(5))
    assert full.value.status == 503 and "still running" in full.value.message
    big = entry(6)
    big.response["output"] = ["x" * 20_000]
    with pytest.raises(ApiError) as huge:
        ResponseStore(max_count=5, max_bytes=10_000).put(big)
    assert huge.value.status == 400 and huge.value.param == "store"
    mine = ResponseStore(max_count=5, max_bytes=10_000)
    mine.put(entry(7, owner=1))
    with pytest.raises(ApiError) as other:
        mine.get("resp_7", 2)
    assert other.value.status == 404 and mine.get("resp_7", 1).id == "resp_7"
