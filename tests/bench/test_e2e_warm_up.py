"""The e2e warm-up's second pass: prompts that hit the prefix cache, alone then together."""

from __future__ import annotations

from bench.e2e import runner
from bench.workloads import Request


def _request(i: int, ids: list[int] | None = None) -> Request:
    payload = {"input_ids": ids} if ids is not None else {"text": f"prompt {i}", "image_data": ["img"]}
    return Request(runner.WARMUP_SPACING_S * i, "l00", "text", "text", payload, 1, 60.0)


def test_each_prompt_comes_again_in_full_and_one_token_shorter_then_all_at_once() -> None:
    burst = [_request(0, [5, 6, 7, 8]), _request(1, [9, 10, 11])]
    timed = runner.cached_prefix_requests(burst, start_s=1.0)
    prompts = [r.payload["input_ids"] for r in timed]
    assert prompts == [[5, 6, 7, 8], [5, 6, 7], [9, 10, 11], [9, 10], [5, 6, 7, 8], [5, 6, 7], [9, 10, 11], [9, 10]]
    arrivals = [r.arrival_s for r in timed]
    assert arrivals[:4] == [1.0 + runner.WARMUP_SPACING_S * i for i in range(4)]  # one at a time
    assert set(arrivals[4:]) == {1.0 + runner.WARMUP_SPACING_S * 4}  # together, after the last alone
    assert arrivals == sorted(arrivals)  # the client's horizon is the last request's arrival
    assert burst[0].payload["input_ids"] == [5, 6, 7, 8] and burst[0].arrival_s == 0.0  # the burst is untouched
    assert all(r.adapter == "l00" for r in timed)


def test_a_prompt_without_token_ids_comes_again_in_full_only() -> None:
    burst = [_request(0), _request(1, [1])]
    timed = runner.cached_prefix_requests(burst, start_s=0.5)
    assert [r.payload for r in timed] == [burst[0].payload, burst[1].payload] * 2
    assert timed[0].payload is not burst[0].payload
