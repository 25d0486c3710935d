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


def test_the_last_pass_sends_fresh_requests_of_each_point_at_its_rate() -> None:
    from bench.e2e import plan

    points = [plan.points_of("gpu")["sgl-decode"], plan.points_of("cpu")["vision-skewed"]]
    names = ["l00", "l01"]
    timed = runner.steady_requests(points, names, seed=7, lora=True)
    text = [r for r in timed if "input_ids" in r.payload]
    images = [r for r in timed if "input_ids" not in r.payload]
    assert len(text) == runner.WARMUP_STEADY_REQUESTS  # a quarter of 100, at most 24
    assert 0 < len(images) <= points[1].requests // 4  # a quarter of 12
    assert all(len(r.payload["input_ids"]) == points[0].input_len for r in text)
    assert {r.payload["lora_path"] for r in text} == set(names)
    arrivals = [r.arrival_s for r in timed]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    span = text[-1].arrival_s - text[0].arrival_s  # 23 gaps of mean 1 / rate
    assert 0.4 < span / ((len(text) - 1) / points[0].rate) < 2.0
    assert images[0].arrival_s > text[-1].arrival_s  # the points one after another
    floor = runner.steady_requests(points[:1], names, seed=7, lora=False)
    assert [r.payload["input_ids"] for r in floor] == [r.payload["input_ids"] for r in text]  # same prompts
    assert all("lora_path" not in r.payload for r in floor)
    assert [r.arrival_s for r in floor] == [r.arrival_s for r in text]
