"""Max batch and theta for a server started without --vlora-max-batch / --vlora-theta."""

import pytest

from sglang_vlora.orchestrator import DerivedLimits


def test_flags_win_and_say_so():
    limits = DerivedLimits(16, 5.0, capacity=4096, capacity_source="max running requests")
    limits.observe(300)
    limits.finished(0.4)
    assert limits.max_batch() == (16, "--vlora-max-batch")
    assert limits.theta() == (5.0, "--vlora-theta")


def test_max_batch_is_the_requests_in_flight_within_capacity():
    limits = DerivedLimits(None, None, capacity=160, capacity_source="largest decode CUDA graph")
    assert limits.max_batch()[0] == 1  # nothing seen yet
    for in_flight in (9, 4, 7):
        limits.observe(in_flight)
    value, source = limits.max_batch()
    assert value == 7
    assert source == "requests in flight (running + waiting), at most 160 (largest decode CUDA graph)"
    limits.observe(500)
    assert limits.max_batch()[0] == 160
    limits.observe(0)
    assert limits.max_batch()[0] == 1


def test_a_skewed_load_of_ten_in_flight_can_merge_under_the_derived_max_batch():
    """With SGLang's 4096 as MaxBS no adapter ever holds more than half of it; with the
    batch the server runs, 7 of 10 requests on one adapter do."""
    limits = DerivedLimits(None, None, capacity=4096, capacity_source="max running requests")
    limits.observe(10)
    assert 2 * 7 > limits.max_batch()[0]


def test_theta_is_twice_the_mean_execution_of_finished_requests():
    limits = DerivedLimits(None, None, capacity=64, capacity_source="max running requests", finished_window=2)
    theta, source = limits.theta()
    assert theta == 0 and "no request finished" in source
    for execution in (5.0, 0.5, 1.5):  # 5.0 falls out of the window
        limits.finished(execution)
    theta, source = limits.theta()
    assert theta == pytest.approx(2.0)
    assert source == "2 x mean execution time of the last 2 finished requests"
    limits.finished(float("nan"))
    assert limits.theta()[0] == pytest.approx(2.0)


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        DerivedLimits(None, None, capacity=0, capacity_source="max running requests")
