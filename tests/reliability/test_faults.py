"""Clients that go away: a streaming client killed (SIGKILL) mid-stream and a client that
gives up on a long non-streamed request. The requests running beside them answer as solo
runs do, the abandoned requests are aborted (the server goes idle long before their 3000
tokens would end), and the server keeps serving."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import httpx
import pytest

from tests.reliability.answers import Spec, assert_same_up_to_near_ties, parse, solo_answers
from tests.reliability.conftest import ADMIN, USER, USER_KEY, assert_serving

LONG = 3000  # tokens: minutes on this CPU, so only an abort ends it in time
IDLE_WITHIN_S = 60
NEIGHBOURS = [Spec(a, "What is in the image?") for a in (None, "a8", "b16", "c32")]
MAX_NEW = 12

STREAMING_CLIENT = r"""
import json, sys, httpx
url, key, body = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
with httpx.stream("POST", url + "/generate", json=body, headers={"Authorization": "Bearer " + key}, timeout=600) as r:
    for line in r.iter_lines():
        if line.startswith("data: {"):
            print("token", flush=True)
"""


def long_request(stream: bool) -> dict:
    body = Spec("a8", "Describe the picture.").payload(LONG, stream=stream)
    body.pop("top_logprobs_num")
    return body


def run_neighbours(server, results: list) -> None:
    """The four neighbours, concurrently, in threads (the main thread drives the fault)."""

    def one(spec: Spec) -> None:
        response = httpx.post(server.url + "/generate", json=spec.payload(MAX_NEW), headers=USER, timeout=300)
        results.append((spec, response.status_code, response.json() if response.status_code == 200 else response.text))

    threads = [threading.Thread(target=one, args=(spec,)) for spec in NEIGHBOURS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)


def assert_neighbours_and_idle(server, results: list, solo: dict) -> None:
    assert len(results) == len(NEIGHBOURS)
    for spec, status, body in results:
        assert status == 200, (spec, body)
        assert_same_up_to_near_ties(parse(body), solo[spec], f"{spec} beside the abandoned request")
    # /flush_cache runs only on an idle server: the abandoned request was aborted.
    idle = httpx.post(server.url + f"/flush_cache?timeout={IDLE_WITHIN_S}", headers=ADMIN, timeout=IDLE_WITHIN_S + 30)
    assert idle.status_code == 200, idle.text
    assert_serving(server)


@pytest.fixture(scope="module")
def solo(guarded) -> dict:
    return solo_answers(guarded, NEIGHBOURS, MAX_NEW)


def test_a_streaming_client_killed_mid_stream_harms_nobody(guarded, solo):
    client = subprocess.Popen(
        [sys.executable, "-c", STREAMING_CLIENT, guarded.url, USER_KEY, json.dumps(long_request(stream=True))],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        for _ in range(3):
            assert client.stdout.readline() == "token\n"
        results: list = []
        neighbours = threading.Thread(target=run_neighbours, args=(guarded, results))
        neighbours.start()
        client.kill()
        neighbours.join(timeout=300)
    finally:
        client.kill()
        client.wait(timeout=30)
    assert_neighbours_and_idle(guarded, results, solo)


def test_a_client_that_gives_up_on_a_long_request_harms_nobody(guarded, solo):
    results: list = []
    neighbours = threading.Thread(target=run_neighbours, args=(guarded, results))
    neighbours.start()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(guarded.url + "/generate", json=long_request(stream=False), headers=USER, timeout=2.0)
    neighbours.join(timeout=300)
    assert_neighbours_and_idle(guarded, results, solo)
