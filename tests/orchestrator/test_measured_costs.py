"""The cost model a server measures while serving, and a request's application / SLO."""

import pytest

from sglang_vlora.orchestrator import CostModelError, MeasuredCosts, Mode, OutputLengths
from sglang_vlora.orchestrator.request_params import application_and_slo
from tests.orchestrator.builders import req

LAYERS = 28


def test_before_anything_is_measured_execution_and_switches_cost_nothing():
    cost = MeasuredCosts(LAYERS).snapshot()
    assert cost.exec_s(req("r", "a", prompt=100, out=10), Mode.UNMERGE) == 0
    assert cost.switch_s((Mode.UNMERGE, None), (Mode.MERGE, "a"), {"a": 16}) == 0


def test_latencies_are_per_mode_averages_over_the_window():
    costs = MeasuredCosts(LAYERS, window=2)
    costs.record_iteration(Mode.UNMERGE, 100, 1.0)  # falls out of the window below
    costs.record_iteration(Mode.UNMERGE, 100, 0.2)
    costs.record_iteration(Mode.UNMERGE, 300, 0.6)
    costs.record_iteration(Mode.MERGE, 0, 0.01)
    costs.record_iteration(Mode.MERGE, 0, 0.03)
    cost = costs.snapshot()
    assert cost.prefill_token_s[Mode.UNMERGE] == pytest.approx(0.8 / 400)
    assert cost.decode_step_s[Mode.MERGE] == pytest.approx(0.02)


def test_an_unmeasured_mode_is_charged_the_slowest_measured_one():
    costs = MeasuredCosts(LAYERS)
    costs.record_iteration(Mode.MERGE, 0, 0.01)
    costs.record_iteration(Mode.UNMERGE, 0, 0.03)
    cost = costs.snapshot()
    assert cost.decode_step_s[Mode.MIXTURE] == pytest.approx(0.03)
    assert cost.prefill_token_s[Mode.MIXTURE] == 0  # no prefill measured in any mode yet


def test_switches_fit_per_rank_and_a_missing_kind_borrows_its_mirror():
    costs = MeasuredCosts(LAYERS)
    costs.record_switch("merge", 16, LAYERS * 1e-4)
    costs.record_switch("merge", 64, LAYERS * 4e-4)
    cost = costs.snapshot()
    ranks = {"a": 32, "b": 16}
    assert cost.switch_s((Mode.UNMERGE, None), (Mode.MERGE, "a"), ranks) == pytest.approx(LAYERS * 2e-4)
    assert cost.switch_s((Mode.MERGE, "a"), (Mode.UNMERGE, None), ranks) == pytest.approx(LAYERS * 2e-4)
    # no fused point: unmerge a, then merge b
    assert cost.switch_s((Mode.MERGE, "a"), (Mode.MIXTURE, "b"), ranks) == pytest.approx(LAYERS * 3e-4)
    costs.record_switch("fused", 48, LAYERS * 2.5e-4)
    assert costs.snapshot().switch_s((Mode.MERGE, "a"), (Mode.MERGE, "b"), ranks) == pytest.approx(LAYERS * 2.5e-4)


def test_bad_measurements_are_ignored_and_bad_kinds_refused():
    costs = MeasuredCosts(LAYERS)
    costs.record_iteration(Mode.MERGE, 0, float("nan"))
    costs.record_iteration(Mode.MERGE, 0, -1.0)
    costs.record_switch("merge", 16, float("inf"))
    assert costs.snapshot().decode_step_s[Mode.MERGE] == 0 and costs.measured_switches() == 0
    with pytest.raises(CostModelError, match="unknown switch kind"):
        costs.record_switch("swap", 16, 0.001)


def test_the_snapshot_is_reused_until_something_new_is_measured():
    costs = MeasuredCosts(LAYERS)
    first = costs.snapshot()
    assert costs.snapshot() is first
    costs.record_iteration(Mode.MERGE, 0, 0.01)
    assert costs.snapshot() is not first


def test_output_length_is_learned_per_group_and_capped():
    lengths = OutputLengths(window=3)
    assert lengths.expected("video", cap=64, so_far=0) == 64  # nothing finished: the cap
    assert lengths.expected("video", cap=None, so_far=5) == 6  # no cap either: one more token
    for tokens in (100, 10, 20, 30):  # the window keeps the last three
        lengths.record("video", tokens)
    assert lengths.expected("video", cap=None, so_far=0) == 20
    assert lengths.expected("video", cap=8, so_far=0) == 8
    assert lengths.expected("video", cap=None, so_far=25) == 25  # never below what is already out
    assert lengths.expected("retrieval", cap=None, so_far=0) == 1  # groups are separate


@pytest.mark.parametrize(
    "params, expected",
    [
        (None, (None, None)),
        ({}, (None, None)),
        ({"vlora_app": "retrieval"}, ("retrieval", None)),
        ({"vlora_app": "video", "vlora_slo_ms": 250}, ("video", 0.25)),
        ({"vlora_slo_ms": 1.5}, (None, 0.0015)),
    ],
)
def test_application_and_slo_are_read_from_custom_params(params, expected):
    assert application_and_slo(params) == expected


@pytest.mark.parametrize(
    "params",
    [
        {"vlora_slo_ms": 0},
        {"vlora_slo_ms": -5},
        {"vlora_slo_ms": "fast"},
        {"vlora_slo_ms": True},
        {"vlora_slo_ms": float("inf")},
        {"vlora_app": ""},
        {"vlora_app": 7},
        {"vlora_app": "x" * 129},
    ],
)
def test_malformed_application_or_slo_is_refused(params):
    with pytest.raises(ValueError, match="custom_params.vlora_"):
        application_and_slo(params)
