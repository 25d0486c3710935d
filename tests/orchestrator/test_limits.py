"""Max batch and theta for a server started without --vlora-max-batch / --vlora-theta."""

import pytest

from sglang_vlora.orchestrator import DerivedLimits


def test_flags_win_and_say_so():
    limits = DerivedLimits(16, 5.0, capacity=4096, capacity_source="max running requests")
    limits.observe(0.0, 300)
    limits.finished(0.4)
    assert limits.max_batch() == (16, "--vlora-max-batch")
    assert limits.theta() == (5.0, "--vlora-theta")


def test_max_batch_is_the_requests_in_flight_within_capacity():
    limits = DerivedLimits(None, None, capacity=160, capacity_source="largest decode CUDA graph")
    assert limits.max_batch()[0] == 1  # nothing seen yet
    limits.observe(0.0, 7)
    value, source = limits.max_batch()
    assert value == 7
    assert source == (
        "requests in flight (running + waiting), now or averaged over the busy period, "
        "at most 160 (largest decode CUDA graph)"
    )
    limits.observe(0.1, 500)
    assert limits.max_batch()[0] == 160


def test_the_tail_of_a_burst_is_measured_against_the_burst():
    """16 requests in flight for 2 s, then 2 left: those 2 (often of one adapter) are not a
    majority of the batch the server has been running."""
    limits = DerivedLimits(None, None, capacity=4096, capacity_source="max running requests")
    for step in range(20):
        limits.observe(0.1 * step, 16)
    limits.observe(2.0, 2)
    limits.observe(2.1, 2)
    assert limits.max_batch()[0] >= 15
    limits.idle()  # a new busy period starts from what is in flight
    limits.observe(10.0, 3)
    assert limits.max_batch()[0] == 3


def test_the_average_forgets_over_about_one_execution_time():
    limits = DerivedLimits(None, None, capacity=4096, capacity_source="max running requests")
    limits.finished(0.5)
    limits.observe(0.0, 20)
    for step in range(1, 31):  # 3 s at 4 in flight: six execution times
        limits.observe(0.1 * step, 4)
    assert limits.max_batch()[0] == 4
    assert "averaged over the mean execution time" in limits.max_batch()[1]


def test_theta_is_one_and_a_half_times_the_mean_execution_of_finished_requests():
    limits = DerivedLimits(None, None, capacity=64, capacity_source="max running requests", finished_window=2)
    theta, source = limits.theta()
    assert theta == 0 and "no request finished" in source
    for execution in (5.0, 0.5, 1.5):  # 5.0 falls out of the window
        limits.finished(execution)
    theta, source = limits.theta()
    assert theta == pytest.approx(1.5)
    assert source == "1.5 x mean execution time of the last 2 finished requests"
    limits.finished(float("nan"))
    assert limits.theta()[0] == pytest.approx(1.5)


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        DerivedLimits(None, None, capacity=0, capacity_source="max running requests")


def test_the_values_the_decisions_read_are_those_the_status_shows():
    import random

    rng = random.Random(7)
    for flags in ((None, None), (16, None), (None, 5.0), (16, 5.0)):
        limits = DerivedLimits(*flags, capacity=48, capacity_source="test")
        now = 0.0
        for step in range(300):
            now += rng.uniform(0.001, 0.05)
            limits.observe(now, rng.randint(0, 60))
            if step % 7 == 0:
                limits.finished(rng.uniform(0.05, 2.0))
            if step % 50 == 49:
                limits.idle()
            assert limits.max_batch_value() == limits.max_batch()[0]
            assert limits.theta_value() == limits.theta()[0]
