"""The cost model a server measures while serving (fake clock, fixed batches), and a
request's application / SLO."""

import itertools
import random

import numpy as np
import pytest

from sglang_vlora.orchestrator import CostModelError, MeasuredCosts, Mode, OutputLengths
from sglang_vlora.orchestrator.iteration_fit import IterationFit
from sglang_vlora.orchestrator.request_params import application_and_slo
from tests.orchestrator.builders import req

LAYERS = 28


def test_before_anything_is_measured_execution_and_switches_cost_nothing():
    cost = MeasuredCosts(LAYERS).snapshot()
    assert cost.exec_s(req("r", "a", prompt=100, out=10), Mode.UNMERGE) == 0
    assert cost.switch_s((Mode.UNMERGE, None), (Mode.MERGE, "a"), {"a": 16}) == 0


# A made-up server: 4 ms per iteration, 20 ms more for one that runs a prefill (an eager
# forward, where a decode step replays a graph), 20 us per prefill token, 0.1 ms per
# decoding request in unmerge; merge is 25% cheaper per token and per request and its
# prefill forward 2 ms cheaper.
TRUE = {  # (fixed, prefill_forward, per_token, per_request)
    Mode.UNMERGE: (0.004, 0.020, 2.0e-5, 1.0e-4),
    Mode.MERGE: (0.004, 0.018, 1.5e-5, 0.75e-4),
}


def seconds(mode: Mode, tokens: int, requests: int) -> float:
    fixed, forward, per_token, per_request = TRUE[mode]
    return fixed + (forward if tokens else 0.0) + per_token * tokens + per_request * requests


# Fixed batches as a server sees them: big prefills, short prompts, prefix-cache hits and
# last chunks of a few tokens, mixed chunks with decoding requests riding along, decode
# steps of 4-16.
BATCHES = [
    (1024, 0), (5, 0), (37, 3), (512, 8), (0, 4), (0, 8), (0, 16), (3, 0), (2048, 0), (0, 12),
    (40, 0), (64, 0), (80, 0), (48, 2),
]


def test_per_token_prefill_is_the_slope_not_iteration_time_over_tokens():
    """Dividing iteration time by prefill tokens charges the fixed part to every token: a
    5-token prefill would read 5e-3 s per token. The fit recovers the true 2e-5, and the
    fixed cost of a prefill forward apart from a decode step's."""
    costs = MeasuredCosts(LAYERS, refit_every=1)
    for mode in TRUE:
        for tokens, requests in BATCHES:
            costs.record_iteration(mode, tokens, requests, seconds(mode, tokens, requests))
    cost = costs.snapshot()
    for mode, (fixed, forward, per_token, per_request) in TRUE.items():
        assert cost.prefill_token_s[mode] == pytest.approx(per_token, rel=1e-6)
        assert cost.prefill_forward_s[mode] == pytest.approx(fixed + forward, rel=1e-6)
        mean_decode_batch = round((4 + 8 + 16 + 12) / 4)
        assert cost.decode_step_s[mode] == pytest.approx(fixed + per_request * mean_decode_batch, rel=1e-6)
        fit = costs.fits[mode]
        coefficients = (fit.fixed_s, fit.prefill_forward_s, fit.prefill_token_s, fit.decode_request_s)
        assert coefficients == pytest.approx((fixed, forward, per_token, per_request), rel=1e-6)
    assert cost.prefill_token_s[Mode.MIXTURE] == cost.prefill_token_s[Mode.UNMERGE]  # unmeasured: the slowest
    assert cost.prefill_forward_s[Mode.MIXTURE] == cost.prefill_forward_s[Mode.UNMERGE]


def test_outliers_and_noise_do_not_move_the_fit_far():
    """2% multiplicative noise, and a few iterations that paid for something else (a host
    stall of 50 ms): the fit stays within 5% of the truth."""
    rng = random.Random(0)
    costs = MeasuredCosts(LAYERS, refit_every=1)
    for i in range(200):
        tokens, requests = BATCHES[i % len(BATCHES)]
        value = seconds(Mode.UNMERGE, tokens, requests) * rng.uniform(0.98, 1.02)
        costs.record_iteration(Mode.UNMERGE, tokens, requests, value + (0.05 if i % 37 == 0 else 0.0))
    costs.snapshot()
    fit = costs.fits[Mode.UNMERGE]
    assert fit.prefill_token_s == pytest.approx(2.0e-5, rel=0.05)
    assert fit.prefill_forward_s == pytest.approx(0.020, rel=0.05)
    assert fit.seconds(0, 8) == pytest.approx(seconds(Mode.UNMERGE, 0, 8), rel=0.05)
    assert fit.seconds(60, 0) == pytest.approx(seconds(Mode.UNMERGE, 60, 0), rel=0.05)
    assert fit.samples < 200  # the stalls were dropped


def test_a_prefill_forwards_fixed_cost_stays_out_of_the_per_token_cost():
    """The case measured on an H200: decode steps replay a graph in about 8 ms (+0.1 ms per
    request), a prefill forward runs eagerly in about 60 ms for 40-80 tokens and 75 ms for
    1024. With one fixed term for both, the prefill forward's fixed cost goes into the
    slope; its own term keeps the slope at the marginal cost."""
    fixed, forward, per_token, per_request = 0.008, 0.052, 1.5e-5, 1.0e-4
    rng = random.Random(2)
    samples = []
    for i in range(256):
        if i % 64 == 10:
            tokens, requests = 1024, 0
        elif i % 4 == 0:
            tokens, requests = rng.randint(40, 80), 0
        else:
            tokens, requests = 0, rng.randint(1, 16)
        value = fixed + (forward if tokens else 0.0) + per_token * tokens + per_request * requests
        stall = 0.05 if i % 41 == 7 else 0.0
        samples.append((tokens, requests, value * rng.uniform(0.99, 1.01) + stall))
    costs = MeasuredCosts(LAYERS)
    for tokens, requests, value in samples:
        costs.record_iteration(Mode.UNMERGE, tokens, requests, value)
    cost = costs.snapshot()
    assert cost.prefill_token_s[Mode.UNMERGE] == pytest.approx(per_token, rel=0.25)
    prefill_1024 = cost.prefill_forward_s[Mode.UNMERGE] + 1024 * cost.prefill_token_s[Mode.UNMERGE]
    assert prefill_1024 == pytest.approx(fixed + forward + 1024 * per_token, rel=0.25)
    assert costs.fits[Mode.UNMERGE].seconds(1024, 0) == pytest.approx(prefill_1024)
    old = _one_fixed_term_fit(samples)  # the same samples fail both bounds without the term
    assert old[1] > 3 * per_token and old @ [1.0, 1024, 0] > 1.25 * (fixed + forward + 1024 * per_token)


def _one_fixed_term_fit(samples: list[tuple[int, int, float]]) -> np.ndarray:
    """The model before the prefill forward's term: ``(fixed, per_token, per_request)`` by
    non-negative least squares (the best non-negative least squares fit over subsets of
    the columns), without the outlier refit."""
    x = np.array([[1.0, t, r] for t, r, _ in samples])
    y = np.array([s for *_, s in samples])
    fits = []
    for size in (1, 2, 3):
        for subset in itertools.combinations(range(3), size):
            coef = np.zeros(3)
            coef[list(subset)] = np.linalg.lstsq(x[:, subset], y)[0]
            if coef.min() >= 0:
                fits.append(coef)
    return min(fits, key=lambda coef: float(np.sum((x @ coef - y) ** 2)))


def test_a_rare_kind_of_iteration_is_never_dropped_as_an_outlier():
    """Forty prefills on an exact line and two decode steps that disagree (10 and 30 ms):
    both decode steps are far off the fit by the prefills' median residual, yet they stay
    in it, so a decode step costs something."""
    costs = MeasuredCosts(LAYERS)
    for i in range(40):
        tokens = 100 + 50 * i
        costs.record_iteration(Mode.UNMERGE, tokens, 0, 2e-5 * tokens)
    costs.record_iteration(Mode.UNMERGE, 0, 4, 0.01)
    costs.record_iteration(Mode.UNMERGE, 0, 4, 0.03)
    assert costs.snapshot().decode_step_s[Mode.UNMERGE] == pytest.approx(0.02)


def test_a_first_batch_that_paid_one_time_costs_is_dropped_among_its_kind():
    """A first prefill that compiled kernels (seconds), fifteen ordinary prefills and many
    more decode steps. Judged by the decode steps' residuals every prefill is an outlier, so
    none would be dropped and the first one would set a prefill forward of about 0.2 s.
    Judged within their own kind, only it goes."""
    costs = MeasuredCosts(LAYERS)
    costs.record_iteration(Mode.UNMERGE, 54, 0, 2.66)
    rng = random.Random(3)
    for i in range(15):
        tokens = (32, 128, 512, 1024)[i % 4]
        costs.record_iteration(Mode.UNMERGE, tokens, 0, (0.055 + 5e-5 * tokens) * rng.uniform(0.97, 1.03))
    for _ in range(48):
        costs.record_iteration(Mode.UNMERGE, 0, 4, 0.012 * rng.uniform(0.97, 1.03))
    cost = costs.snapshot()
    assert cost.prefill_forward_s[Mode.UNMERGE] == pytest.approx(0.055, rel=0.1)
    assert cost.prefill_token_s[Mode.UNMERGE] == pytest.approx(5e-5, rel=0.15)
    assert costs.fits[Mode.UNMERGE].samples == 63


def test_one_prompt_size_goes_to_the_prefill_forwards_fixed_cost():
    """Every prefill of one size: the slope cannot be told apart from the fixed part, so the
    whole time is the prefill forward's fixed cost (its error is the marginal part only),
    and a constant decode batch still gets a marginal per-request cost."""
    costs = MeasuredCosts(LAYERS)
    for _ in range(5):
        costs.record_iteration(Mode.MERGE, 1000, 0, 0.024)
        costs.record_iteration(Mode.MERGE, 0, 8, 0.008)
    cost = costs.snapshot()
    assert cost.prefill_token_s[Mode.MERGE] == 0
    assert cost.exec_s(req("r", "a", prompt=1000, out=1), Mode.MERGE) == pytest.approx(0.024 + 0.008)
    assert costs.fits[Mode.MERGE].decode_request_s == pytest.approx(0.001)


# SGLang's warm-up request on a fresh H200 server (revision 420d304): one 54-token prefill
# of 1.2 s (the server's first, compiling kernels) and seven decode steps; the profile read
# the fit made of them after 1024-token prefills.
WARM_UP = [(54, 0, 1.205)] + [(0, 1, 0.0082)] * 7


def test_the_start_up_warm_up_alone_does_not_scale_its_prefill_by_prompt_size():
    """With the warm-up's one prefill the fit used to charge 22 ms a token, a 1024-token
    prefill 22.8 s (bench/results/profile_cost_model_startup_h200.json); now it is charged
    the one prefill measured, cold as it was."""
    costs = MeasuredCosts(LAYERS)
    for sample in WARM_UP:
        costs.record_iteration(Mode.UNMERGE, *sample)
    cost = costs.snapshot()
    assert costs.fits[Mode.UNMERGE].seconds(1024, 0) == pytest.approx(1.205, rel=1e-6)
    assert cost.prefill_forward_s[Mode.UNMERGE] == pytest.approx(1.205, rel=1e-6)
    assert cost.prefill_token_s[Mode.UNMERGE] == 0


def test_a_fit_that_misses_new_samples_is_redone_before_its_samples_double():
    """The eight warm-up samples were fitted; the doubling rule would redo the fit at sixteen.
    A sample within 2x of the fit is no miss; 1024-token prefills of 80 ms, which the fit
    charges 1.2 s, are, and make it due once four samples came since it. The 54-token
    prefills, more than 5 times slower than the three larger ones, are left out as cold."""
    costs = MeasuredCosts(LAYERS)
    for sample in WARM_UP:
        costs.record_iteration(Mode.UNMERGE, *sample)
    costs.snapshot()
    costs.record_iteration(Mode.UNMERGE, 54, 0, 0.9)  # within 2x of the fit: no miss
    costs.snapshot()
    assert costs.fits[Mode.UNMERGE].samples == 8
    for _ in range(2):
        costs.record_iteration(Mode.UNMERGE, 1024, 0, 0.08)
        costs.snapshot()
    assert costs.fits[Mode.UNMERGE].samples == 8  # three samples since the fit: not yet
    costs.record_iteration(Mode.UNMERGE, 1024, 0, 0.08)  # the fourth
    costs.snapshot()
    fit = costs.fits[Mode.UNMERGE]
    assert fit.samples == 10  # 12 less the two 54-token prefills, cold against the three larger ones
    assert fit.seconds(1024, 0) == pytest.approx(0.08, rel=1e-6)
    for tokens in (128, 512, 2048, 256, 64, 1024):  # many sizes: the slope is fitted again
        costs.record_iteration(Mode.UNMERGE, tokens, 0, 0.055 + 2e-5 * tokens)
    for _ in range(16):
        costs.record_iteration(Mode.UNMERGE, 512, 0, 0.055 + 2e-5 * 512)
    assert costs.snapshot().prefill_token_s[Mode.UNMERGE] > 0


def test_the_window_keeps_the_last_iterations():
    costs = MeasuredCosts(LAYERS, window=3, refit_every=1)
    costs.record_iteration(Mode.UNMERGE, 0, 4, 1.0)  # falls out of the window below
    for _ in range(3):
        costs.record_iteration(Mode.UNMERGE, 0, 4, 0.01)
    assert costs.snapshot().decode_step_s[Mode.UNMERGE] == pytest.approx(0.01)


def test_an_unmeasured_mode_is_charged_the_slowest_measured_one():
    costs = MeasuredCosts(LAYERS)
    costs.record_iteration(Mode.MERGE, 0, 4, 0.01)
    costs.record_iteration(Mode.UNMERGE, 0, 4, 0.03)
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
    costs.record_iteration(Mode.MERGE, 0, 4, float("nan"))
    costs.record_iteration(Mode.MERGE, 0, 4, -1.0)
    costs.record_iteration(Mode.MERGE, 0, 0, 0.5)  # no work in it
    costs.record_switch("merge", 16, float("inf"))
    assert costs.snapshot().decode_step_s[Mode.MERGE] == 0 and costs.measured_switches() == 0
    with pytest.raises(CostModelError, match="unknown switch kind"):
        costs.record_switch("swap", 16, 0.001)


def test_the_fit_is_redone_as_samples_double_then_every_few_iterations():
    costs = MeasuredCosts(LAYERS, refit_every=4)
    first = costs.snapshot()
    assert costs.snapshot() is first
    refits = []
    for i in range(1, 17):
        costs.record_iteration(Mode.MERGE, 0, 4, 0.01 * i)
        snapshot = costs.snapshot()
        if snapshot is not first:
            refits.append(i)
            first = snapshot
    assert refits == [1, 2, 4, 8, 12, 16]  # 1, 2, 4 samples; then every 4 new ones
    assert first.decode_step_s[Mode.MERGE] == pytest.approx(0.01 * sum(range(1, 17)) / 16)


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


def test_the_recent_iterations_are_the_last_of_each_mode_oldest_first():
    costs = MeasuredCosts(LAYERS)
    for i in range(20):
        costs.record_iteration(Mode.UNMERGE, 0, i + 1, 0.01)
    costs.record_iteration(Mode.MERGE, 64, 0, 0.05)
    recent = costs.recent_iterations(last=4)
    assert recent == {Mode.UNMERGE: [(0, 17, 0.01), (0, 18, 0.01), (0, 19, 0.01), (0, 20, 0.01)],
                      Mode.MERGE: [(64, 0, 0.05)]}


# What a fresh unmerge-only server on an H200 timed, in order (revision 88a675a,
# bench/results/profile_cost_model_startup_samples_h200.json): SGLang's warm-up prefill of 54
# tokens compiling kernels (4.9 s), its decode steps (two cold), a 1-token prefill, a first
# 1024-token prefill (0.52 s, new shapes), then 1024-token prefills of 41-70 ms; its forward
# profiled at 66-72 ms.
H200_START = [(54, 0, 4.896857), (0, 1, 0.444996), (0, 1, 0.163265), (0, 1, 0.007307), (0, 1, 0.007313),
              (0, 1, 0.007172), (0, 1, 0.007222), (0, 1, 0.007168), (1, 0, 0.052415), (1024, 0, 0.518298),
              (1024, 0, 0.04099), (1024, 0, 0.069969), (1024, 0, 0.064349), (1024, 0, 0.059899),
              (1024, 0, 0.069897)]


def test_a_fit_made_of_start_up_iterations_is_redone_once_it_misses():
    """The fit of the first nine samples charged 91 ms a prompt token (92.8 s for a 1024-token
    prefill), and the doubling rule kept it to the sixteenth sample. The prefills it misses by
    more than 2x make it due sooner, and the cold iterations (the 4.9 s warm-up prefill, the
    518 ms first 1024-token one, the two slow first decode steps) are left out once enough
    larger iterations of their kind show them up: by the last sample a 1024-token prefill is
    charged within 25% of the 66-72 ms profiled, a decode step what the warm steps took."""
    costs = MeasuredCosts(LAYERS)
    for sample in H200_START:
        costs.record_iteration(Mode.UNMERGE, *sample)
        costs.snapshot()  # the scheduler reads the cost model every iteration
    fit = costs.fits[Mode.UNMERGE]
    assert 0.066 * 0.75 <= fit.seconds(1024, 0) <= 0.072 * 1.25
    assert fit.seconds(0, 1) == pytest.approx(0.0072, rel=0.05)


def test_a_cold_iteration_is_judged_against_larger_ones_of_its_kind():
    """A 54-token prefill of 4.9 s against three 1024-token prefills of about 60 ms: cold. A
    4096-token prefill of 300 ms against them is not judged (no three at least as large), nor
    is a small prefill slower than its own size's others by less than 5x."""
    samples = [(54, 0, 4.9), (1024, 0, 0.06), (1024, 0, 0.062), (1024, 0, 0.058), (4096, 0, 0.3),
               (32, 0, 0.2), (0, 8, 0.008), (0, 8, 0.0081), (0, 4, 0.2), (0, 16, 0.009)]
    fit = IterationFit.fit(samples)
    assert fit.samples == len(samples) - 2  # the 54-token prefill and the 4-request step of 200 ms


def test_an_iteration_far_slower_than_its_fit_is_kept_as_a_stall():
    """Decode steps of 8 ms and 1500-token prefills of 50 ms fitted: a prefill of 400 ms (a
    stall) is kept with when it was read and the fit's prediction; a step of 20 ms (over 2x,
    but by 12 ms) and a prefill of 90 ms (under 2x) are not. Without a fit nothing is judged."""
    from sglang_vlora.orchestrator.cost_model import SLOW_KEPT

    costs = MeasuredCosts(LAYERS)
    costs.record_iteration(Mode.MERGE, 1500, 0, 5.0, at=1.0)  # no fit yet: not judged
    assert costs.slow_count == 0
    for i in range(8):
        costs.record_iteration(Mode.MERGE, 0, 4 + i % 2, 0.008)
        costs.record_iteration(Mode.MERGE, 1400 + 20 * i, 0, 0.048 + 1e-6 * 20 * i)
    costs.snapshot()
    predicted = costs.fits[Mode.MERGE].seconds(1500, 0)
    costs.record_iteration(Mode.MERGE, 0, 4, 0.020, at=2.0)
    costs.record_iteration(Mode.MERGE, 1500, 0, 0.090, at=3.0)
    costs.record_iteration(Mode.MERGE, 1500, 0, 0.400, at=4.0)
    assert costs.slow_count == 1 and [(s.at, s.mode, s.prefill_tokens, s.seconds) for s in costs.slow] == [
        (4.0, Mode.MERGE, 1500, 0.400)]
    assert costs.slow[0].predicted_s == pytest.approx(predicted)
    assert costs.slow_excess_s == pytest.approx(0.400 - predicted)
    for i in range(SLOW_KEPT + 3):  # the count goes on; the list keeps the latest
        costs.record_iteration(Mode.MERGE, 0, 4, 0.5, at=10.0 + i)
    assert costs.slow_count == SLOW_KEPT + 4 and len(costs.slow) == SLOW_KEPT and costs.slow[-1].at == 10.0 + SLOW_KEPT + 2


def test_a_fit_judges_only_work_it_has_seen():
    """A mixture fit made of decode steps alone predicts about nothing for a 1500-token prefill:
    that prefill is a sample (the next fit learns from it), not a stall; once the fit has seen
    prefills, a prefill far over it is one."""
    costs = MeasuredCosts(LAYERS)
    for i in range(8):
        costs.record_iteration(Mode.MIXTURE, 0, 4 + i % 2, 0.008)
    costs.snapshot()
    assert costs.fits[Mode.MIXTURE].seconds(1500, 0) < 0.02
    costs.record_iteration(Mode.MIXTURE, 1500, 0, 0.080, at=1.0)
    assert costs.slow_count == 0
    costs.record_iteration(Mode.MIXTURE, 0, 4, 0.400, at=2.0)  # a decode step the fit knows: a stall
    assert [(s.at, s.prefill_tokens) for s in costs.slow] == [(2.0, 0)]
    for i in range(8):
        costs.record_iteration(Mode.MIXTURE, 1400 + 20 * i, 0, 0.048 + 1e-6 * 20 * i)
    costs.snapshot()
    costs.record_iteration(Mode.MIXTURE, 1500, 0, 0.400, at=3.0)
    assert [(s.at, s.prefill_tokens) for s in costs.slow] == [(2.0, 0), (3.0, 1500)]


def test_the_fits_normal_equations_match_the_design_matrix():
    """The one-pass sums the fit solves from are ``X'X``, ``X'y`` and ``y'y`` of the rows
    ``(1, [tokens > 0], tokens / token scale, requests / request scale)``, checked against
    numpy's products of the matrix built row by row (decode steps, prefills, mixed batches)."""
    import numpy as np

    from sglang_vlora.orchestrator.iteration_fit import _normal_equations

    samples = [(0, 8, 0.008), (1024, 0, 0.061), (0, 3, 0.0072), (700, 5, 0.07), (1, 0, 0.05), (2048, 2, 0.12)]
    x = np.array([[1.0, 1.0 if t else 0.0, t / 2048, r / 8] for t, r, _ in samples])
    y = np.array([s for _, _, s in samples])
    gram, moment, yy = _normal_equations(samples, 2048.0, 8.0)
    np.testing.assert_allclose(gram, x.T @ x, rtol=1e-12)
    np.testing.assert_allclose(moment, x.T @ y, rtol=1e-12)
    assert yy == pytest.approx(float(y @ y), rel=1e-12)
