"""The orchestrator in a real server (``--vlora-policy vlora``, the default): a workload
with 80% of requests on one adapter runs mostly merged, a uniform 4-adapter workload runs
unmerged, and every output passes the parity suite's check against HF + peft whatever
mode it ran in. Operator controls and request fields refuse bad values with a 400."""

import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from sglang_vlora.orchestrator import DECISION_REASONS
from tests.conftest import launch, stop
from tests.server.reference import HFReference, assert_matches_reference, chat_text, parse_generation

MAX_BATCH = 16
ALL = ["a8", "b16", "c32", "d8"]
POPULAR_WINDOW = 16


@pytest.fixture(scope="module")
def orchestrated(tiny_assets, tmp_path_factory):
    model, adapters = tiny_assets
    # d8 is a8's files under a second name: a fourth adapter for the uniform workload.
    adapters = {**adapters, "d8": adapters["a8"]}
    srv = launch(
        model, adapters, tmp_path_factory.mktemp("orchestrated") / "server.log",
        # theta far above the run time: nothing starves, so the mode follows the workload mix;
        # a fixed max batch, so that the first few requests of a burst (they reach the
        # scheduler one by one) are no majority. (The dLoRA server below derives it.)
        # Small prefill chunks: long prompts are chunked, and the chunked request is part of
        # the policy's running set. Algorithm 1's own admission and line 5 (the defaults admit
        # the others at once and keep a merged top adapter: tests/orchestrator/test_keep_merged.py).
        # A popularity window shorter than the default's 32, to see the flag reach the server:
        # the late majority below (12 requests) is then popular as soon as it has arrived.
        ["--max-loras-per-batch", "5", "--vlora-max-batch", str(MAX_BATCH), "--vlora-theta", "60",
         "--vlora-admission", "algorithm1", "--vlora-keep-merged", "majority",
         "--enable-metrics", "--chunked-prefill-size", "64", "--vlora-popular-window", str(POPULAR_WINDOW)],
    )
    yield srv
    stop(srv)


@pytest.fixture(scope="module")
def reference(orchestrated) -> HFReference:
    return HFReference(orchestrated.model_dir, orchestrated.adapters)


def status(server) -> dict:
    response = httpx.get(server.url + "/vlora/status", timeout=60)
    response.raise_for_status()
    return response.json()


def assert_reasons_add_up(report: dict) -> None:
    """Every reason is listed (zeros too) and every decision counted under one of them."""
    reasons = report["decision_reasons"]
    assert list(reasons) == list(DECISION_REASONS)
    assert sum(reasons.values()) == sum(report["decisions"].values()) > 0, (reasons, report["decisions"])


def run_workload(server, reference, adapters: list[str | None]) -> dict[str, int]:
    """Send the requests in one call (they queue together), check every output against
    HF + peft, return the iterations each mode ran."""
    texts = [chat_text(f"Describe scene number {i}.", with_image=False) for i in range(len(adapters))]
    before = status(server)["orchestrator"]["iterations"]
    generate_and_check(server, reference, texts, adapters, max_new_tokens=8)
    after = status(server)["orchestrator"]["iterations"]
    return {mode: after[mode] - before[mode] for mode in after}


def generate_and_check(server, reference, texts: list[str], adapters: list[str | None], max_new_tokens: int) -> list:
    """One batched greedy ``/generate`` of ``texts`` (they queue together); every output is
    checked against HF + peft. Returns the response bodies."""
    response = httpx.post(
        server.url + "/generate",
        json={
            "text": texts,
            "lora_path": adapters,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
            "return_logprob": True,
        },
        timeout=600,
    )
    response.raise_for_status()
    bodies = response.json()
    for text, adapter, body in zip(texts, adapters, bodies, strict=True):
        assert_matches_reference(reference, parse_generation(body), text, None, adapter)
    return bodies


def test_a_skewed_workload_runs_mostly_merged(orchestrated, reference):
    adapters = ["a8"] * 26 + ["b16", "c32", "d8", None, "b16", "c32"]  # 81% on a8
    random.Random(0).shuffle(adapters)
    waits_before = status(orchestrated)["orchestrator"]["admission_waits"]
    merges_before = status(orchestrated)["orchestrator"]["decision_reasons"]["merge"]
    ran = run_workload(orchestrated, reference, adapters)
    total = sum(ran.values())
    assert ran["merge"] + ran["mixture"] >= total / 2, ran
    assert ran["merge"] > ran["unmerge"], ran
    state = status(orchestrated)
    assert state["orchestrator"]["switches"] >= 2  # merged a8, and went back
    assert_reasons_add_up(state["orchestrator"])
    assert state["orchestrator"]["decision_reasons"]["merge"] > merges_before  # line 5 held for a8
    assert state["mode"] == "unmerge"  # the other adapters' requests ran last
    # every request's admission wait is counted under its adapter; with a8 merged the others
    # were held back (theta 60 s: until a8's requests were done), so on average they waited
    # longer (one may be admitted at once: the first request the scheduler sees is alone)
    waits = state["orchestrator"]["admission_waits"]
    grew = {name: (w["requests"] - waits_before.get(name, {}).get("requests", 0),
                   w["total_s"] - waits_before.get(name, {}).get("total_s", 0.0)) for name, w in waits.items()}
    expected = {name: sum((a or "base") == name for a in adapters) for name in {a or "base" for a in adapters}}
    assert {name: n for name, (n, _) in grew.items() if n} == expected
    others = [grew[name] for name in expected if name != "a8"]
    mean_others = sum(t for _, t in others) / sum(n for n, _ in others)
    assert mean_others > grew["a8"][1] / grew["a8"][0], grew


def test_a_uniform_workload_runs_unmerged(orchestrated, reference):
    adapters = ALL * (MAX_BATCH // len(ALL))  # every adapter holds a quarter of the batch
    random.Random(1).shuffle(adapters)
    ran = run_workload(orchestrated, reference, adapters)
    assert ran["merge"] == ran["mixture"] == 0 and ran["unmerge"] > 0, ran


def test_chunked_long_prompts_and_shared_prefixes_match_hf(orchestrated, reference):
    """Prompts of ~150 tokens (3 prefill chunks each) sharing a long prefix (radix cache hits
    within each adapter), on a skewed mix: whatever mode each chunk ran in, outputs match."""
    shared = " ".join(f"frame{i} shows a red car and a blue truck." for i in range(12))
    texts = [chat_text(f"{shared} Question {i}: how many vehicles?", with_image=False) for i in range(8)]
    adapters = ["a8", "a8", "a8", "a8", "a8", "b16", None, "c32"]
    bodies = generate_and_check(orchestrated, reference, texts, adapters, max_new_tokens=6)
    assert max(b["meta_info"]["prompt_tokens"] for b in bodies) > 128


def test_status_reports_the_policy_its_limits_and_measured_costs(orchestrated, reference):
    run_workload(orchestrated, reference, ALL * 2)  # unmerged decode steps of its own: it runs alone too
    answer = status(orchestrated)
    assert answer["cuda_allocator"] is None  # the CUDA allocator's counters: none on a CPU server
    report = answer["orchestrator"]
    assert (report["policy"], report["theta_s"], report["theta_source"]) == ("vlora", 60.0, "--vlora-theta")
    assert (report["max_batch"], report["max_batch_source"]) == (MAX_BATCH, "--vlora-max-batch")
    costs = report["cost_model"]
    assert costs["source"] == "measured while serving"
    assert costs["decode_step_s"]["unmerge"] > 0
    fit = costs["iteration_fits"]["unmerge"]
    # the tiny model's prompt tokens cost next to nothing on CPU: the fit may give them 0
    terms = (fit["fixed_s"], fit["prefill_forward_s"], fit["prefill_token_s"], fit["decode_request_s"])
    assert fit["samples"] > 0 and min(terms) >= 0
    assert costs["prefill_token_s"]["unmerge"] == fit["prefill_token_s"]
    assert costs["prefill_forward_s"]["unmerge"] == pytest.approx(fit["fixed_s"] + fit["prefill_forward_s"])
    recent = costs["recent_iterations"]["unmerge"]  # what the fit is made of: (tokens, requests, seconds)
    assert 0 < len(recent) <= 16 and all(t >= 0 and r >= 0 and t + r > 0 and s > 0 for t, r, s in recent)
    slow = costs["slow_iterations"]  # iterations over 2x their fit: a count, the summed excess, the latest
    assert slow["count"] >= 0 and slow["excess_s"] >= 0 and len(slow["last"]) == min(slow["count"], 32)
    assert all(mode in ("merge", "unmerge", "mixture") and seconds > 2 * predicted
               for _, mode, _, _, seconds, predicted in slow["last"])
    assert report["switches"] >= 3  # the start-up merge / fused / unmerge measurement
    # the scheduler hooks' host time, over the iterations that had requests to decide for
    assert report["hook_calls"] >= sum(report["iterations"].values()) > 0
    assert 0 < report["hook_seconds_total"] < report["hook_calls"]  # well under a second a call
    parts = report["hook_seconds_by_part"]
    assert set(parts) == {"timings", "requests", "decide", "apply", "batch"}
    assert all(v >= 0 for v in parts.values()) and parts["decide"] > 0
    assert sum(parts.values()) <= report["hook_seconds_total"]  # the parts of the same iterations
    assert sum(report["switches_by_kind"].values()) == report["switches"]
    assert report["switches_by_kind"]["merge"] >= 1 and report["switches_by_kind"]["unmerge"] >= 1
    # popularity: the adapters of the last POPULAR_WINDOW requests to arrive (base-model ones as "base")
    arrivals = report["arrival_shares"]
    assert arrivals["window"] == POPULAR_WINDOW and 0 < arrivals["arrivals"] <= POPULAR_WINDOW
    assert set(arrivals["shares"]) <= {*ALL, "base"}
    assert sum(arrivals["shares"].values()) == pytest.approx(1.0)


def test_the_timeline_lists_each_timed_iteration_in_order(orchestrated, reference):
    """GET /vlora/timeline?since=T: every iteration timed after T, in order, with its mode
    and work; the ones a workload ran are there, as many as the status counts (less the
    iterations not timed: the first request's and the one whose timing is still pending).
    A bad ``since`` is a 400 and the server keeps serving."""
    since = max((row[0] for row in httpx.get(orchestrated.url + "/vlora/timeline", timeout=60)
                 .json()["iterations"]), default=0.0)
    counts = run_workload(orchestrated, reference, ALL * 2)
    answer = httpx.get(orchestrated.url + "/vlora/timeline", params={"since": since}, timeout=60).json()
    assert answer["complete"] and answer["columns"][:2] == ["at", "mode"]
    rows = answer["iterations"]
    assert rows and [r[0] for r in rows] == sorted(r[0] for r in rows) and all(r[0] > since for r in rows)
    assert all(mode in ("merge", "mixture", "unmerge") and tokens + requests > 0 and seconds > 0
               for _, mode, tokens, requests, seconds in rows)
    ran = sum(counts.values())
    assert ran - 2 <= len(rows) <= ran + 2, (len(rows), counts)  # timings are read an iteration late
    for bad in ("soon", "-1", "nan"):
        response = httpx.get(orchestrated.url + "/vlora/timeline", params={"since": bad}, timeout=60)
        assert response.status_code == 400 and "since must be" in response.json()["error"], response.text
    assert generate(orchestrated, {}).status_code == 200


def test_the_first_request_the_server_ran_is_not_a_cost_sample(orchestrated):
    """SGLang's warm-up (at most 8 output tokens) is the first request: its iterations pay
    one-off costs and are listed apart, not fitted. Its prompt may take several 64-token
    chunks; the first token comes with the prefill."""
    costs = status(orchestrated)["orchestrator"]["cost_model"]
    first = costs["first_request_iterations"]  # [mode, prefill tokens, decoding requests]
    assert costs["first_request_iteration_count"] == len(first) > 0
    prefills = [it for it in first if it[1] > 0]
    assert first[: len(prefills)] == prefills and all(requests == 0 for _, _, requests in prefills), first
    decodes = first[len(prefills):]
    assert prefills and len(decodes) <= 7 and all(tokens == 0 and requests == 1 for _, tokens, requests in decodes)
    assert {mode for mode, _, _ in first} == {"unmerge"}  # a base-model request, nothing merged for it


def test_metrics_carry_modes_switches_and_queues(orchestrated):
    text = httpx.get(orchestrated.url + "/metrics", timeout=60).text
    for series in (
        'sglang:vlora_iterations_total{mode="unmerge"}',
        "sglang:vlora_switches_total",
        "sglang:vlora_switch_seconds_total",
        "sglang:vlora_last_switch_seconds",
        "sglang:vlora_starving_requests",
        'sglang:vlora_queue_requests{adapter="a8"}',
        'sglang:vlora_mode{mode="merge"}',
    ):
        assert series in text, series


def test_modes_cannot_be_set_by_hand_under_a_policy(orchestrated):
    response = httpx.post(orchestrated.url + "/vlora/mode", json={"mode": "merge", "adapter": "a8"}, timeout=60)
    assert response.status_code == 400
    assert "--vlora-policy manual" in response.json()["error"]


def generate(server, custom_params: dict) -> httpx.Response:
    return httpx.post(
        server.url + "/generate",
        json={
            "text": chat_text("Count the cars.", with_image=False),
            "lora_path": "b16",
            "sampling_params": {"max_new_tokens": 4, "temperature": 0, "custom_params": custom_params},
        },
        timeout=120,
    )


@pytest.mark.parametrize(
    "custom_params", [{"vlora_slo_ms": -1}, {"vlora_slo_ms": "soon"}, {"vlora_app": ""}, {"vlora_app": 3}]
)
def test_a_malformed_slo_is_a_400_and_the_server_keeps_serving(orchestrated, custom_params):
    response = generate(orchestrated, custom_params)
    assert response.status_code == 400, response.text
    assert "custom_params.vlora_" in response.text
    assert generate(orchestrated, {}).status_code == 200


def test_an_application_and_slo_change_nothing_in_the_answer(orchestrated):
    plain = generate(orchestrated, {})
    tagged = generate(orchestrated, {"vlora_app": "video", "vlora_slo_ms": 500})
    assert tagged.status_code == 200
    assert tagged.json()["text"] == plain.json()["text"]


@pytest.fixture(scope="module")
def dlora_server(tiny_assets, tmp_path_factory):
    model, adapters = tiny_assets
    srv = launch(
        model, adapters, tmp_path_factory.mktemp("dlora") / "server.log",
        ["--max-loras-per-batch", "5", "--vlora-theta", "60", "--vlora-policy", "dlora"],
    )
    yield srv
    stop(srv)


def late_majority(server) -> dict[str, int]:
    """Three long b16 requests start; 0.5 s later twelve short a8 requests arrive and make
    a8 the dominant adapter while the b16 requests are still decoding (long enough that a
    fast machine, and the switch budget's wait after an earlier switch, leave them running
    when a8 is merged). Returns the iterations each mode ran."""
    def send(adapter: str, count: int, tokens: int) -> None:
        texts = [chat_text(f"Scene {adapter} {i}: what moves?", with_image=False) for i in range(count)]
        httpx.post(
            server.url + "/generate",
            json={"text": texts, "lora_path": [adapter] * count,
                  "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}},
            timeout=600,
        ).raise_for_status()

    before = status(server)["orchestrator"]["iterations"]
    with ThreadPoolExecutor(2) as pool:
        long_b = pool.submit(send, "b16", 3, 160)
        time.sleep(0.5)
        pool.submit(send, "a8", 12, 4).result()
        long_b.result()
    after = status(server)["orchestrator"]["iterations"]
    return {mode: after[mode] - before[mode] for mode in after}


def test_accounting_counts_what_ran_mixture_for_vlora_none_for_dlora(orchestrated, dlora_server):
    """V-LoRA merges a8 at once and runs the b16 requests around it (mixture); dLoRA has no
    mixture, so it lets the b16 requests finish before it merges: its counters show no
    mixture iteration (an earlier dLoRA merged with other adapters running, and its
    batches ran as mixture). The dLoRA server derives its max batch."""
    vlora = late_majority(orchestrated)
    assert vlora["mixture"] > 0 and vlora["merge"] > 0, vlora
    dlora = late_majority(dlora_server)
    assert dlora["mixture"] == 0 and dlora["merge"] > 0, dlora
    for server in (orchestrated, dlora_server):
        assert_reasons_add_up(status(server)["orchestrator"])


def test_without_flags_the_max_batch_is_derived_and_merging_reachable(dlora_server):
    """The dLoRA server has no --vlora-max-batch: with SGLang's 4096 as the max batch no
    adapter could hold more than half of it; derived from the requests in flight, the
    late majority above merged (see the previous test)."""
    report = status(dlora_server)["orchestrator"]
    assert report["max_batch_source"].startswith("requests in flight (running + waiting)")
    assert report["max_batch_source"].endswith("at most 4096 (max running requests)")
    assert 1 <= report["max_batch"] <= 15
    assert report["iterations"]["merge"] > 0
