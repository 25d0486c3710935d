"""The orchestrator's own merges under the LoRA pool's slots: with the base and three
adapters decoding on all four slots, a burst for a fifth adapter makes it most of the queue.
Whether Algorithm 1 asks to merge it while the slots are held (the mode controller then
refuses, a ValueError the orchestrator treats as "could not switch, stay") or only once a
slot is free, no request is lost or changed and the server keeps serving."""

from __future__ import annotations

import asyncio
import json

import httpx

from tests.reliability.answers import Spec, assert_same_up_to_near_ties, parse, solo_answers
from tests.reliability.conftest import USER

QUESTION = "What is in the image?"
LONG, SHORT = 32, 12
RUNNING = [None, "a8", "b16", "c32"] * 2
BURST = 16  # requests for the fifth adapter: most of the queue, so Algorithm 1 wants it merged


async def _burst(server) -> list:
    async with httpx.AsyncClient(timeout=300) as client:
        async def one(spec: Spec, max_new: int, decoding: asyncio.Event | None = None) -> tuple:
            body = spec.payload(max_new, stream=decoding is not None)
            if decoding is None:
                r = await client.post(server.url + "/generate", json=body, headers=USER)
                return spec, max_new, r.status_code, r.json() if r.status_code == 200 else r.text
            last = None
            async with client.stream("POST", server.url + "/generate", json=body, headers=USER) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        last = json.loads(line[len("data: "):])
                        decoding.set()
                return spec, max_new, r.status_code, last

        events = [asyncio.Event() for _ in RUNNING]
        running = [asyncio.create_task(one(Spec(a, QUESTION), LONG, e)) for a, e in zip(RUNNING, events, strict=True)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), timeout=120)
        burst = [asyncio.create_task(one(Spec("fifth", QUESTION), SHORT)) for _ in range(BURST)]
        return await asyncio.gather(*running, *burst)


def test_orchestrator_merges_wait_for_a_pool_slot_and_lose_nothing(one_key):
    srv = one_key  # only --api-key: it opens the admin routes too
    solo = {LONG: solo_answers(srv, [Spec(a, QUESTION) for a in RUNNING[:4]], LONG, admin=USER),
            SHORT: solo_answers(srv, [Spec("fifth", QUESTION)], SHORT, admin=USER)}
    results = asyncio.run(_burst(srv))
    errors = [(spec, status, body) for spec, _, status, body in results if status != 200 or body is None]
    assert not errors, errors[:3]
    for spec, max_new, _, body in results:
        answer = parse(body)
        assert len(answer.tokens) == max_new, spec
        assert_same_up_to_near_ties(answer, solo[max_new][spec], f"{spec} beside the orchestrator's merges")
    assert srv.alive(), srv.log_tail()
    status = httpx.get(srv.url + "/vlora/status", headers=USER, timeout=60).json()["orchestrator"]
    refused = "needs a LoRA pool slot" in srv.log_path.read_text(errors="replace")
    print("orchestrator:", status["switches"], "switches", status["iterations"], "refused for a slot:", refused)
