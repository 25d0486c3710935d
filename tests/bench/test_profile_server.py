"""The profile's cost-model check evaluates the orchestrator's fits at the profiled batches."""

from __future__ import annotations

import pytest

from bench.profile_server import cost_model_check


def test_cost_model_check_evaluates_each_fit_at_the_profiled_batch() -> None:
    fit = {"fixed_s": 0.008, "prefill_forward_s": 0.05, "prefill_token_s": 2e-5, "decode_request_s": 1e-4,
           "samples": 40}
    status = {"orchestrator": {"cost_model": {"iteration_fits": {"unmerge": fit}}}}
    rows = cost_model_check(status, {"prefill4": {"span_us_per_step": 80_000.0},
                                     "decode8": {"period_us": 8_000.0}})["rows"]
    # prefill4: four 256-token prompts in one forward
    assert rows["prefill4/unmerge"]["fit_ms"] == pytest.approx(8 + 50 + 1024 * 0.02)
    assert rows["prefill4/unmerge"]["fit_over_profile"] == pytest.approx((8 + 50 + 20.48) / 80)
    # decode8: a step of eight requests, no prefill forward
    assert rows["decode8/unmerge"]["fit_ms"] == pytest.approx(8 + 0.8)
    assert rows["decode8/unmerge"]["profile_ms"] == pytest.approx(8.0)


def test_cost_model_check_without_fits_or_profile_times() -> None:
    assert cost_model_check({}, {"decode8": {"period_us": 8_000.0}})["rows"] == {}
    status = {"orchestrator": {"cost_model": {"iteration_fits": {"merge": {"fixed_s": 0.01, "samples": 3}}}}}
    row = cost_model_check(status, {"decode8": {"period_us": None}})["rows"]["decode8/merge"]
    assert row["profile_ms"] is None and row["fit_over_profile"] is None


def test_a_negative_latency_count_is_refused() -> None:
    import argparse

    from bench.profile_server import _count

    assert _count("0") == 0 and _count("25") == 25
    with pytest.raises(argparse.ArgumentTypeError, match=">= 0"):
        _count("-3")
