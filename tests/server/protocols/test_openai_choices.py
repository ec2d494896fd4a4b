"""OpenAI's `n`, through the official client: several choices of one
prompt, the prompt read once (the others start in copies of the slot that
read it), each choice drawn with its own seed: choice i is what a request
of its own with seed + i answers."""

from __future__ import annotations

import pytest

from api_helpers import CHAT, openai_client
from server_process import ServerProcess

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path, "-np", "3") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def test_each_chat_choice_is_the_answer_of_its_own_seed(client):
    many = client.chat.completions.create(model="m", messages=CHAT, n=3, seed=10, temperature=1.0, max_tokens=12)
    assert [c.index for c in many.choices] == [0, 1, 2]
    for i, c in enumerate(many.choices):
        alone = client.chat.completions.create(model="m", messages=CHAT, seed=10 + i, temperature=1.0, max_tokens=12)
        assert c.message.content == alone.choices[0].message.content, i
    assert len({c.message.content for c in many.choices}) > 1, "three seeds, three draws"
    assert many.usage.prompt_tokens == alone.usage.prompt_tokens
    assert many.usage.completion_tokens == sum(
        client.chat.completions.create(model="m", messages=CHAT, seed=10 + i, temperature=1.0,
                                       max_tokens=12).usage.completion_tokens for i in range(3))


def test_choices_in_a_named_slot_are_the_same_answers(client):
    # The named slot reads the prompt and answers the first choice; the others answer from its copies.
    free = client.chat.completions.create(model="m", messages=CHAT, n=2, seed=3, temperature=1.0, max_tokens=8)
    for _ in range(2):  # again, with the slot holding the prompt
        named = client.chat.completions.create(model="m", messages=CHAT, n=2, seed=3, temperature=1.0, max_tokens=8,
                                               extra_body={"id_slot": 0})
        assert [c.message.content for c in named.choices] == [c.message.content for c in free.choices]


def test_streamed_choices_arrive_by_index_and_read_the_prompt_once(client):
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Name three colours."}],
                                            n=3, seed=4, temperature=1.0, max_tokens=10, stream=True)
    text, finish, cached = ["", "", ""], [None] * 3, {}
    for chunk in stream:
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            finish[c.index] = c.finish_reason or finish[c.index]
            if c.finish_reason:
                cached[c.index] = chunk.model_extra["timings"]
    assert all(finish) and all(text)
    n_prompt = cached[0]["cache_n"] + cached[0]["prompt_n"]
    for i in (1, 2):
        assert cached[i]["cache_n"] >= n_prompt - 1 and cached[i]["prompt_n"] <= 1, (i, cached[i])
    whole = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Name three colours."}],
                                           n=3, seed=4, temperature=1.0, max_tokens=10)
    assert [c.message.content for c in whole.choices] == text


def test_text_completions_take_n_too(client):
    many = client.completions.create(model="m", prompt="The sea is", n=2, seed=3, temperature=1.0, max_tokens=8)
    assert [c.index for c in many.choices] == [0, 1]
    for i, c in enumerate(many.choices):
        alone = client.completions.create(model="m", prompt="The sea is", seed=3 + i, temperature=1.0, max_tokens=8)
        assert c.text == alone.choices[0].text


def test_more_choices_than_free_slots_wait_for_them(client, server):
    import threading

    done = []
    hold = threading.Thread(target=lambda: done.append(client.chat.completions.create(
        model="m", messages=CHAT, max_tokens=40, temperature=0)))
    hold.start()
    many = client.chat.completions.create(model="m", messages=CHAT, n=3, seed=1, temperature=1.0, max_tokens=6)
    hold.join()
    assert len(many.choices) == 3 and all(c.message.content for c in many.choices) and done
