"""Nothing lost under load: concurrent requests of every adapter (text and image) while modes
switch and an adapter is hot-loaded and unloaded answer with 0 errors and the tokens a solo
run gives (a different batch may flip a near-tie: allowed only where the solo run's top-2
log-probs are within NEAR_TIE); the base comes back bit-identical. A merge that needs a pool
slot held by running requests is refused with 409 (or waits for one) and loses nothing.

``make soak`` runs the mixed load for minutes (``VLORA_SOAK_S``); CI runs two rounds."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time

import httpx
import pytest

from tests.reliability.answers import Spec, assert_same_up_to_near_ties, parse, solo_answers
from tests.reliability.conftest import ADMIN, USER, assert_serving, set_mode

SOAK_S = float(os.environ.get("VLORA_SOAK_S", "0"))
WAIT_S = 60  # the longest "wait_s" POST /vlora/mode accepts
ADAPTERS = [None, "a8", "b16", "c32"]
QUESTIONS = ["What is in the image?", "Count the digits in the picture."]
SWITCHES = [("merge", "a8"), ("mixture", "b16"), ("merge", "c32"), ("mixture", "a8"), ("unmerge", None)]
SPECS = [Spec(a, q) for a, q in zip(ADAPTERS, QUESTIONS * 2, strict=True)] + [Spec(a, QUESTIONS[0], 7) for a in (None, "c32")]


async def _generate(client: httpx.AsyncClient, url: str, spec: Spec) -> tuple[Spec, int, dict | str]:
    response = await client.post(url + "/generate", json=spec.payload(), headers=USER)
    return spec, response.status_code, response.json() if response.status_code == 200 else response.text


async def _controller(client: httpx.AsyncClient, server, hot_dir, stop: asyncio.Event, log: list) -> None:
    """Mode switches and a hot load / use / unload, round after round, until the load ends."""
    hot = Spec("hot", QUESTIONS[0])
    step = 0
    while not stop.is_set():
        mode, adapter = SWITCHES[step % len(SWITCHES)]
        r = await client.post(server.url + "/vlora/mode", json={"mode": mode, "adapter": adapter, "wait_s": 20}, headers=ADMIN)
        log.append(("mode", mode, adapter, r.status_code, r.text))
        if step % len(SWITCHES) == 1:
            r = await client.post(server.url + "/load_lora_adapter", json={"lora_name": "hot", "lora_path": str(hot_dir)}, headers=ADMIN)
            log.append(("load", r.status_code, r.text))
            log.append(("hot", *(await _generate(client, server.url, hot))[1:]))
            r = await client.post(server.url + "/unload_lora_adapter", json={"lora_name": "hot"}, headers=ADMIN)
            log.append(("unload", r.status_code, r.text))
        step += 1


async def _mixed_load(server, hot_dir) -> tuple[list, list]:
    results: list = []
    log: list = []
    stop = asyncio.Event()
    deadline = time.monotonic() + SOAK_S
    async with httpx.AsyncClient(timeout=300) as client:
        controller = asyncio.create_task(_controller(client, server, hot_dir, stop, log))
        rounds = 0
        # At least two rounds and one whole cycle of switches under load; `make soak`: minutes.
        while rounds < 2 or sum(e[0] == "mode" for e in log) < len(SWITCHES) or time.monotonic() < deadline:
            results += await asyncio.gather(*(_generate(client, server.url, s) for s in SPECS))
            rounds += 1
        stop.set()
        await controller
    return results, log


def test_mixed_load_with_switches_and_hot_reload_matches_solo_runs(guarded, tmp_path):
    hot_dir = tmp_path / "hot"
    shutil.copytree(guarded.adapters["b16"], hot_dir)
    solo = solo_answers(guarded, SPECS)
    results, log = asyncio.run(_mixed_load(guarded, hot_dir))
    assert set_mode(guarded, "unmerge").status_code == 200

    errors = [(spec, status, body) for spec, status, body in results if status != 200]
    assert not errors, errors[:3]
    for spec, _, body in results:
        assert_same_up_to_near_ties(parse(body), solo[spec], f"{spec} under load")
    modes = [entry for entry in log if entry[0] == "mode"]
    print(f"mixed load: {len(results)} requests, {len(modes)} mode calls "
          f"({sum(m[3] == 200 for m in modes)} switched), {sum(e[0] == 'load' for e in log)} hot loads")
    assert all(status in (200, 409) for *_, status, _ in modes), [m for m in modes if m[3] not in (200, 409)]
    assert sum(status == 200 for *_, status, _ in modes) >= len(SWITCHES) - 1, modes
    for entry in log:
        if entry[0] in ("load", "unload"):
            assert entry[1] == 200, entry
        if entry[0] == "hot":
            assert entry[1] == 200, entry
            assert_same_up_to_near_ties(parse(entry[2]), solo[Spec("b16", QUESTIONS[0])], "hot-loaded copy of b16")
    again = solo_answers(guarded, SPECS)
    for spec in SPECS:  # every switch undone exactly: solo runs are bit-identical
        assert (again[spec].tokens, again[spec].logprobs) == (solo[spec].tokens, solo[spec].logprobs), spec
    assert_serving(guarded)


async def _stream(
    client: httpx.AsyncClient, url: str, spec: Spec, max_new: int, decoding: asyncio.Event
) -> tuple[int, dict | None]:
    """A streamed request: set ``decoding`` at its first token, return its last chunk."""
    last = None
    async with client.stream("POST", url + "/generate", json=spec.payload(max_new, stream=True), headers=USER) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                last = json.loads(line[len("data: "):])
                decoding.set()
        return response.status_code, last


@pytest.fixture
def fifth_adapter(guarded, tmp_path):
    """A fifth loaded adapter: with the base and three adapters decoding, all four pool slots are held."""
    path = tmp_path / "fifth"
    shutil.copytree(guarded.adapters["b16"], path)
    r = httpx.post(guarded.url + "/load_lora_adapter", json={"lora_name": "fifth", "lora_path": str(path)}, headers=ADMIN, timeout=60)
    assert r.status_code == 200, r.text
    yield "fifth"
    assert set_mode(guarded, "unmerge").status_code == 200
    httpx.post(guarded.url + "/unload_lora_adapter", json={"lora_name": "fifth"}, headers=ADMIN, timeout=60)


async def _merge_while_slots_are_busy(server, specs: list[Spec], max_new: int) -> tuple[list, httpx.Response, httpx.Response]:
    async with httpx.AsyncClient(timeout=300) as client:
        events = [asyncio.Event() for _ in specs]
        tasks = [asyncio.create_task(_stream(client, server.url, s, max_new, e)) for s, e in zip(specs, events, strict=True)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), timeout=120)
        body = {"mode": "merge", "adapter": "fifth"}
        refused = await client.post(server.url + "/vlora/mode", json=body, headers=ADMIN)
        started = time.monotonic()
        waited = await client.post(server.url + "/vlora/mode", json={**body, "wait_s": WAIT_S}, headers=ADMIN)
        waited_s = time.monotonic() - started
        still_running = not all(t.done() for t in tasks)
        return await asyncio.gather(*tasks), refused, (waited, waited_s, still_running)


def test_a_merge_that_needs_a_busy_slot_is_refused_or_waits_and_loses_nothing(guarded, fifth_adapter):
    max_new = 24
    solo = {a: solo_answers(guarded, [Spec(a, QUESTIONS[0])], max_new)[Spec(a, QUESTIONS[0])] for a in ADAPTERS}
    specs = [Spec(a, QUESTIONS[0]) for a in ADAPTERS] * 4  # 16 requests decoding on 4 slots
    streams, refused, (waited, waited_s, still_running) = asyncio.run(_merge_while_slots_are_busy(guarded, specs, max_new))
    assert refused.status_code == 409, refused.text
    assert "needs a LoRA pool slot" in refused.text and "--max-loras-per-batch" in refused.text
    if waited.status_code == 409:  # a slow machine: the requests outlived the whole wait
        assert waited_s >= WAIT_S and still_running, (waited_s, waited.text)
        waited = set_mode(guarded, "merge", "fifth")
    assert waited.status_code == 200, waited.text
    assert waited.json()["merged_adapter"] == "fifth"
    for spec, (status, last) in zip(specs, streams, strict=True):
        assert status == 200 and last is not None, (spec, status)
        assert last["meta_info"]["completion_tokens"] == max_new, spec
        assert_same_up_to_near_ties(parse(last), solo[spec.adapter], f"{spec} during the merge")
    merged = httpx.post(guarded.url + "/generate", json=Spec("fifth", QUESTIONS[0]).payload(max_new), headers=USER, timeout=120)
    assert merged.status_code == 200
    assert_same_up_to_near_ties(parse(merged.json()), solo["b16"], "the merged copy of b16")
    assert_serving(guarded)
