"""Vertex AI's prediction protocol (`ember.server.protocols.vertex`), served
where the environment says the server runs there (AIP_MODE=PREDICTION), as
llama-server serves it: instances answered by the server's own routes, by
name or path, side by side."""

from __future__ import annotations

import json
import os

import pytest

from server_process import ServerProcess, http

CHAT = [{"role": "user", "content": "Say hello"}]


@pytest.fixture(scope="module")
def vertex(smollm2_path):
    env = {**os.environ, "AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "0", "AIP_HEALTH_ROUTE": "/healthz"}
    with ServerProcess(smollm2_path, env=env) as s:
        yield s


def test_instances_are_answered_by_the_routes_they_name(vertex):
    body = {"instances": [
        {"@requestFormat": "chatCompletions", "messages": CHAT, "max_tokens": 4, "temperature": 0},
        {"@requestFormat": "/completion", "prompt": "Once upon", "n_predict": 3, "temperature": 0, "stream": True},
        {"@requestFormat": "tokenize", "content": "hello"},
    ]}
    status, _, raw = http(vertex.url + "/predict", body)
    assert status == 200, raw
    chat, completion, tokens = json.loads(raw)["predictions"]
    alone = json.loads(http(vertex.url + "/v1/chat/completions",
                            {"messages": CHAT, "max_tokens": 4, "temperature": 0})[2])
    assert chat["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]
    # A stream is answered whole there.
    assert completion["tokens_predicted"] == 3 and completion["stop"] is True
    assert tokens["tokens"] == json.loads(http(vertex.url + "/tokenize", {"content": "hello"})[2])["tokens"]
    assert any("Vertex AI (AIP_MODE=PREDICTION): predictions at POST /predict" in line for line in vertex.lines)


def test_a_bad_instance_is_its_own_error_and_the_others_are_answered(vertex):
    body = {"instances": [{"messages": CHAT}, {"@requestFormat": "noSuchRoute"}, 7,
                          {"@requestFormat": "chatCompletions", "messages": CHAT, "max_tokens": 2,
                           "temperature": -1},
                          {"@requestFormat": "tokenize", "content": "ok"}]}
    status, _, raw = http(vertex.url + "/predict", body)
    assert status == 200, raw
    p = json.loads(raw)["predictions"]
    assert "@requestFormat: required" in p[0]["error"]["message"]
    assert "no route 'noSuchRoute'" in p[1]["error"]["message"]
    assert "must be a JSON object" in p[2]["error"]["message"]
    assert p[3]["error"]["param"] == "temperature" and p[3]["error"]["code"] == 400
    assert p[4]["tokens"]


@pytest.mark.parametrize("body, says", [({"instances": {}}, "instances: required"), ([], "a JSON object"),
                                        ({"instances": [{}] * 129}, "at most 128")])
def test_a_bad_prediction_is_a_400(vertex, body, says):
    status, _, raw = http(vertex.url + "/predict", body)
    assert status == 400 and says in json.loads(raw)["error"]["message"], raw


def test_the_health_route_the_platform_names(vertex):
    status, _, raw = http(vertex.url + "/healthz", method="GET")
    assert status == 200 and json.loads(raw) == {"status": "ok"}


def test_outside_vertex_there_is_no_predict_route(smollm2_path):
    from ember.server.protocols.vertex import gcp_routes, request_format

    assert gcp_routes({}) is None and gcp_routes({"AIP_MODE": "PREDICTION"}) == ("/predict", None)
    assert request_format("/v1/chat/completions") == "chatCompletions"
    assert request_format("/apply-template") == "applyTemplate" and request_format("/slots/{id_slot}") == "slots"
