"""The cost model: schema validation, the switch fit, transitions, and where it comes from."""

import json

import pytest

from sglang_vlora.orchestrator import CostModel, CostModelError, Mode, load_cost_model
from sglang_vlora.orchestrator.cost_model import SwitchFit
from tests.orchestrator.builders import LAYERS, MEASURED, cost_model, measured, req

RANKS = {"a": 16, "b": 64}


def test_fit_recovers_a_per_layer_line_across_ranks_and_layer_counts():
    per_layer, per_rank = 1.0e-4, 2.0e-6
    points = [
        (rank, layers, layers * (per_layer + rank * per_rank)) for rank in (8, 16, 64) for layers in (16, 32)
    ]
    fit = SwitchFit.fit(points)
    assert fit.per_layer_s == pytest.approx(per_layer)
    assert fit.per_layer_rank_s == pytest.approx(per_rank)
    assert fit.seconds(128, 80) == pytest.approx(80 * (per_layer + 128 * per_rank))


def test_fit_of_one_rank_is_flat():
    fit = SwitchFit.fit([(16, 32, 0.004), (16, 16, 0.0022)])
    assert fit.per_layer_rank_s == 0 and fit.per_layer_s == pytest.approx((0.004 / 32 + 0.0022 / 16) / 2)


def test_fit_never_predicts_negative_costs():
    falling = SwitchFit.fit([(8, 32, 0.005), (64, 32, 0.004)])
    assert falling.per_layer_rank_s == 0 and falling.seconds(10_000, 32) == pytest.approx(0.0045)
    steep = SwitchFit.fit([(8, 1, 1e-6), (64, 1, 1e-3)])
    assert steep.per_layer_s == 0 and steep.seconds(1, 1) > 0


def test_execution_time_counts_remaining_prefill_and_decode():
    model = cost_model()
    request = req("r", "a", prompt=100, out=10, prefilled=40, done=3)
    latency = MEASURED["token_latency_s"]["mixture"]
    assert model.exec_s(request, Mode.MIXTURE) == pytest.approx(
        60 * latency["prefill_token"] + 7 * latency["decode_step"]
    )


def test_a_prefill_forward_is_charged_only_while_prompt_tokens_are_left():
    data = measured()
    data["token_latency_s"]["mixture"]["prefill_forward"] = 0.05
    model = cost_model(data)
    latency = data["token_latency_s"]["mixture"]
    prefilling = req("r", "a", prompt=100, out=10, prefilled=40, done=0)
    assert model.exec_s(prefilling, Mode.MIXTURE) == pytest.approx(
        0.05 + 60 * latency["prefill_token"] + 10 * latency["decode_step"]
    )
    decoding = req("r", "a", prompt=100, out=10, prefilled=100, done=3)
    assert model.exec_s(decoding, Mode.MIXTURE) == pytest.approx(7 * latency["decode_step"])
    merge = data["token_latency_s"]["merge"]  # no prefill_forward: 0
    assert model.exec_s(prefilling, Mode.MERGE) == pytest.approx(
        60 * merge["prefill_token"] + 10 * merge["decode_step"]
    )


def test_switch_costs_follow_the_weights():
    model = cost_model()
    merge_a = model.merge.seconds(16, LAYERS)
    assert model.switch_s((Mode.MERGE, "a"), (Mode.MIXTURE, "a"), RANKS) == 0
    assert model.switch_s((Mode.UNMERGE, None), (Mode.UNMERGE, None), RANKS) == 0
    assert model.switch_s((Mode.UNMERGE, None), (Mode.MIXTURE, "a"), RANKS) == pytest.approx(merge_a)
    assert model.switch_s((Mode.MERGE, "b"), (Mode.UNMERGE, None), RANKS) == pytest.approx(
        model.unmerge.seconds(64, LAYERS)
    )
    assert model.switch_s((Mode.MERGE, "a"), (Mode.MERGE, "b"), RANKS) == pytest.approx(
        model.fused.seconds(80, LAYERS)
    )
    assert merge_a == pytest.approx(0.004)  # the measured point itself


def test_fused_switch_without_measurements_is_unmerge_then_merge():
    data = measured()
    del data["switch_s"]["fused"]
    model = cost_model(data)
    expected = model.unmerge.seconds(16, LAYERS) + model.merge.seconds(64, LAYERS)
    assert model.switch_s((Mode.MIXTURE, "a"), (Mode.MERGE, "b"), RANKS) == pytest.approx(expected)


def test_switch_scales_with_the_served_models_layers():
    small, large = cost_model(layers=16), cost_model(layers=64)
    src, dst = (Mode.UNMERGE, None), (Mode.MERGE, "b")
    assert large.switch_s(src, dst, RANKS) == pytest.approx(4 * small.switch_s(src, dst, RANKS))


def test_unknown_rank_is_a_clear_error():
    with pytest.raises(CostModelError, match="'zz'"):
        cost_model().switch_s((Mode.UNMERGE, None), (Mode.MERGE, "zz"), RANKS)


def test_file_round_trip(tmp_path):
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(MEASURED))
    model = CostModel.from_file(path, LAYERS)
    assert model == cost_model()
    assert model.source == "test data"
    assert model.prefill_forward_s == dict.fromkeys(Mode, 0.0)  # a file without prefill_forward


def test_file_with_prefill_forward(tmp_path):
    data = measured()
    for mode, seconds in (("merge", 0.050), ("mixture", 0.052), ("unmerge", 0.055)):
        data["token_latency_s"][mode]["prefill_forward"] = seconds
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(data))
    model = CostModel.from_file(path, LAYERS)
    assert model.prefill_forward_s == {Mode.MERGE: 0.050, Mode.MIXTURE: 0.052, Mode.UNMERGE: 0.055}
    assert model.prefill_token_s == cost_model().prefill_token_s


def _broken(mutate):
    data = measured()
    mutate(data)
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "schema"),
        (_broken(lambda d: d.update(schema="v0")), "schema"),
        (_broken(lambda d: d.pop("token_latency_s")), "token_latency_s"),
        (_broken(lambda d: d["token_latency_s"].pop("mixture")), "mixture"),
        (_broken(lambda d: d["token_latency_s"]["merge"].update(decode_step=-1)), "merge.decode_step"),
        (_broken(lambda d: d["token_latency_s"]["merge"].update(prefill_token=True)), "prefill_token"),
        (
            _broken(lambda d: d["token_latency_s"]["merge"].update(prefill_token=float("inf"))),
            "prefill_token",
        ),
        (
            _broken(lambda d: d["token_latency_s"]["unmerge"].update(prefill_forward=-0.05)),
            r"unmerge.prefill_forward: expected a finite number of seconds >= 0, got -0.05",
        ),
        (
            _broken(lambda d: d["token_latency_s"]["merge"].update(prefill_forward="50 ms")),
            "merge.prefill_forward",
        ),
        (_broken(lambda d: d["switch_s"].pop("unmerge")), "unmerge is required"),
        (_broken(lambda d: d["switch_s"].update(swap=[])), "unknown switch kinds"),
        (_broken(lambda d: d["switch_s"].update(merge=[])), "non-empty list"),
        (_broken(lambda d: d["switch_s"]["merge"][0].update(rank=0)), r"merge\[0\].rank"),
        (_broken(lambda d: d["switch_s"]["fused"][1].pop("seconds")), r"fused\[1\].seconds"),
    ],
)
def test_schema_errors_say_where(data, message):
    with pytest.raises(CostModelError, match=message):
        CostModel.from_dict(data, LAYERS)


def test_layers_must_be_positive():
    with pytest.raises(CostModelError, match="layers"):
        CostModel.from_dict(MEASURED, 0)


def test_unreadable_file_is_a_cost_model_error(tmp_path):
    path = tmp_path / "cost.json"
    path.write_text("{not json")
    with pytest.raises(CostModelError, match="cannot read"):
        load_cost_model(LAYERS, path=path)
    with pytest.raises(CostModelError, match="cannot read"):
        load_cost_model(LAYERS, path=tmp_path / "missing.json")


def test_no_source_is_an_error():
    with pytest.raises(CostModelError, match="no cost model"):
        load_cost_model(LAYERS)


def test_measurement_runs_only_without_a_file(tmp_path):
    calls = []

    def measure():
        calls.append(1)
        return measured(measured_on="start-up")

    assert load_cost_model(LAYERS, measure=measure).source == "start-up"
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(MEASURED))
    assert load_cost_model(LAYERS, path=path, measure=measure).source == "test data"
    assert calls == [1]


def test_a_bad_measurement_is_reported_as_such():
    with pytest.raises(CostModelError, match="start-up measurement"):
        load_cost_model(LAYERS, measure=lambda: {"schema": "nope"})
