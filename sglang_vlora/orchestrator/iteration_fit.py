"""An iteration's time as a line in its work: ``fixed + prefill_forward * [it runs a
prefill] + per_token * prefill tokens + per_request * decode requests``, fitted by
non-negative least squares.

Why a fit and not a ratio: an iteration has a fixed part (launches, sampling, the
scheduler's own work, attention setup) that does not shrink with the tokens in it.
Dividing a whole iteration by its prefill tokens charges that part to every token, which
is small for a 1024-token prefill and absurd for a 5-token one (a prompt whose prefix the
radix cache holds, the last chunk of a chunked prefill): that is how per-token
estimates of hundredths of a second came out where the marginal cost is tens of
microseconds. The fit separates
the two, and mixed batches (prefill chunks with decoding requests riding along) feed
both terms.

Why a fixed term of its own for an iteration that runs a prefill: a decode step is
usually a CUDA-graph replay with a small fixed cost, while any prefill forward runs
eagerly, launch by launch, with a fixed cost several times larger and nearly independent
of its tokens (host-bound: on an H200 a 43-token prefill took about 60 ms, a 1024-token
one 70-80 ms, a decode step 8 ms). With one fixed term shared by both, a workload of
short prompts pushed the prefill forward's fixed cost into the per-token slope (1.4e-3 s
per token, where the marginal cost is tens of microseconds).

Why the per-token term needs two prompt sizes: with every prefill of one size (the
server's own warm-up request alone, at start-up; a benchmark of fixed-length prompts) the
slope and the prefill forward's fixed cost cannot be told apart. Putting the whole time
on the tokens extrapolates it by the ratio of prompt sizes: SGLang's 54-token warm-up
prefill (1.2 s, the server's first) made a 1024-token prefill 22.8 s on an H200
(``bench/results/profile_cost_model_startup_h200.json``). Putting it on the fixed cost errs
by the marginal part only (tens of microseconds a token) for a warm server, so until two
sizes are seen the per-token term is left out.

Pure Python (no numpy): four unknowns, so every subset of them is solved from the
normal equations and the best non-negative solution is kept (the least squares solution
with non-negative coefficients is the unconstrained one on some subset of the unknowns).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

Sample = tuple[int, int, float]  # (prefill tokens, decode requests, seconds)

# Unknowns, in this order: fixed, prefill_forward, per_token, per_request.
_TERMS = 4
_FIXED_TERMS = (0, 1)
_PER_TOKEN = 2
# Every non-empty subset of the unknowns, tried in this order; a later subset replaces an
# earlier one only if it fits strictly better, so on an exact tie the earlier one wins:
# larger subsets first, then those with fewer fixed terms (a marginal per-request term wins
# over a fixed one, so a constant decode batch still gets a marginal cost), then by index
# (the shared fixed term before the prefill forward's: when every iteration runs a prefill
# the two cannot be told apart and the shared one takes it). Subsets with the per-token
# term are skipped while the samples hold fewer than two prompt sizes (module docstring).
_SUBSETS = sorted(
    (s for size in range(_TERMS, 0, -1) for s in itertools.combinations(range(_TERMS), size)),
    key=lambda s: (-len(s), sum(i in _FIXED_TERMS for i in s), s),
)
_OUTLIER_MADS = 4.0  # a sample this many scaled median absolute residuals off is dropped
_COLD_FACTOR = 5.0  # an iteration this many times slower than its kind's larger ones is cold
_COLD_MIN = 3  # ... judged against at least this many of them


@dataclass(frozen=True)
class IterationFit:
    """``seconds = fixed_s + prefill_forward_s * [tokens > 0] + prefill_token_s * tokens
    + decode_request_s * requests``."""

    fixed_s: float
    prefill_forward_s: float  # on top of fixed_s, in an iteration with prefill tokens
    prefill_token_s: float
    decode_request_s: float
    samples: int  # samples the fit kept (outliers dropped)

    def seconds(self, prefill_tokens: int, decode_requests: int) -> float:
        return (
            self.fixed_s
            + (self.prefill_forward_s if prefill_tokens > 0 else 0.0)
            + self.prefill_token_s * prefill_tokens
            + self.decode_request_s * decode_requests
        )

    @classmethod
    def fit(cls, samples: Sequence[Sample]) -> IterationFit | None:
        """Least squares with non-negative coefficients over the samples less the cold ones
        (:func:`_without_cold`), refitted once without outliers (an iteration that paid for a
        garbage collection or a late host). None without samples."""
        if not samples:
            return None
        samples = _without_cold(samples)
        first = _nnls(samples)
        residuals = [abs(s - first.seconds(t, r)) for t, r, s in samples]
        kinds = [_kind(t, r) for t, r, _ in samples]
        own_residuals: dict[tuple[bool, bool], list[float]] = {}
        own_seconds: dict[tuple[bool, bool], float] = {}
        for kind, res, (_, _, s) in zip(kinds, residuals, samples, strict=True):
            own_residuals.setdefault(kind, []).append(res)
            own_seconds[kind] = own_seconds.get(kind, 0.0) + s
        # scaled median absolute residual within the kind: a window of mostly decode steps
        # must not make every prefill an outlier (and keep the one that paid for a JIT
        # compile); residuals within 0.1% of the kind's mean time are rounding, never outliers
        limits = {
            kind: max(_OUTLIER_MADS * 1.4826 * _median(own), 1e-3 * own_seconds[kind] / len(own))
            for kind, own in own_residuals.items()
        }
        # A kind's limit is at least its median residual, so at least half of every kind is
        # kept: a kind of iteration (every decode step, every prefill) is never dropped whole.
        kept = [x for x, res, kind in zip(samples, residuals, kinds, strict=True) if res <= limits[kind]]
        if len(kept) == len(samples) or len(kept) < 3:
            return first
        return _nnls(kept)


def _without_cold(samples: Sequence[Sample]) -> list[Sample]:
    """``samples`` less the cold iterations: one more than :data:`_COLD_FACTOR` times slower
    than the median of the iterations of its kind that are at least as large (prompt tokens,
    then decode requests; itself included), judged once there are :data:`_COLD_MIN` of them.
    A larger batch of the same kind does not take less time, so such an iteration paid for
    something else, most often kernels compiling on the first run of a shape: on an H200
    SGLang's 54-token warm-up prefill took 4.9 s and the first 1024-token prefill 518 ms,
    where later 1024-token prefills took 41-70 ms (``bench/results/
    profile_cost_model_startup_samples_h200.json``). The residual filter of :meth:`IterationFit.fit`
    cannot drop them while they are most of their kind: they pull the fit it judges by."""
    by_kind: dict[tuple[bool, bool], list[int]] = {}
    for i, (tokens, requests, _) in enumerate(samples):
        by_kind.setdefault(_kind(tokens, requests), []).append(i)
    work = [s[:2] for s in samples]  # (tokens, requests) by index: the sort and group key
    cold: set[int] = set()
    for indices in by_kind.values():
        indices.sort(key=work.__getitem__, reverse=True)
        larger: list[float] = []  # sorted seconds of the iterations at least as large
        for _, group in itertools.groupby(indices, key=work.__getitem__):
            group = list(group)
            for i in group:
                bisect.insort(larger, samples[i][2])
            if len(larger) >= _COLD_MIN:
                mid = len(larger) // 2
                median = larger[mid] if len(larger) % 2 else (larger[mid - 1] + larger[mid]) / 2
                cold.update(i for i in group if samples[i][2] > _COLD_FACTOR * median)
    return [x for i, x in enumerate(samples) if i not in cold]


def _kind(tokens: int, requests: int) -> tuple[bool, bool]:
    """An iteration's kind: whether it prefills, whether it decodes."""
    return bool(tokens), bool(requests)


def _nnls(samples: Sequence[Sample]) -> IterationFit:
    # Each column scaled by its largest value, so the elimination's tolerance means the
    # same for a token count in the thousands as for the 0 / 1 prefill indicator.
    token_scale = float(max(t for t, _, _ in samples) or 1)
    request_scale = float(max(r for _, r, _ in samples) or 1)
    scale = (1.0, 1.0, token_scale, request_scale)
    gram, moment, yy = _normal_equations(samples, token_scale, request_scale)
    best: tuple[float, list[float]] | None = None
    slope_known = len({t for t, _, _ in samples if t}) >= 2
    for subset in _SUBSETS if slope_known else [s for s in _SUBSETS if _PER_TOKEN not in s]:
        coef = _solve([[gram[i][j] for j in subset] for i in subset], [moment[i] for i in subset])
        if coef is None or min(coef) < 0:
            continue
        full = [0.0] * _TERMS
        for i, c in zip(subset, coef, strict=True):
            full[i] = c
        # ||y - Xb||^2 = y'y - 2 b'X'y + b'X'Xb
        sse = yy - 2 * sum(b * m for b, m in zip(full, moment, strict=True)) + sum(
            full[i] * gram[i][j] * full[j] for i, j in itertools.product(range(_TERMS), repeat=2)
        )
        if best is None or sse < best[0] - 1e-12 * max(yy, 1e-30):
            best = (sse, full)
    coef = best[1] if best is not None else [0.0] * _TERMS
    fixed, forward, per_token, per_request = (c / s for c, s in zip(coef, scale, strict=True))
    return IterationFit(fixed, forward, per_token, per_request, len(samples))


def _normal_equations(
    samples: Sequence[Sample], token_scale: float, request_scale: float
) -> tuple[list[list[float]], list[float], float]:
    """``X'X``, ``X'y`` and ``y'y`` for the rows ``x = (1, [tokens > 0], tokens / token_scale,
    requests / request_scale)`` in one pass over the samples. The fit runs in the scheduler's
    loop, so each of the ten distinct products is a local sum rather than an indexed update
    of a 4 x 4 list (about three times faster in CPython, the same sums in the same order)."""
    g01 = g02 = g03 = g11 = g12 = g13 = g22 = g23 = g33 = 0.0
    m0 = m1 = m2 = m3 = yy = 0.0
    for tokens, requests, seconds in samples:
        p = 1.0 if tokens else 0.0
        t = tokens / token_scale
        r = requests / request_scale
        m0 += seconds
        m1 += p * seconds
        m2 += t * seconds
        m3 += r * seconds
        g01 += p
        g02 += t
        g03 += r
        g11 += p * p
        g12 += p * t
        g13 += p * r
        g22 += t * t
        g23 += t * r
        g33 += r * r
        yy += seconds * seconds
    g00 = float(len(samples))
    gram = [[g00, g01, g02, g03], [g01, g11, g12, g13], [g02, g12, g22, g23], [g03, g13, g23, g33]]
    return gram, [m0, m1, m2, m3], yy


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None for a (near) singular system."""
    n = len(rhs)
    a = [row[:] + [b] for row, b in zip(matrix, rhs, strict=True)]
    tolerance = 1e-10 * max(max(abs(v) for v in row[:n]) for row in a)
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= tolerance:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            factor = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= factor * a[col][c]
    out = [0.0] * n
    for r in reversed(range(n)):
        out[r] = (a[r][n] - sum(a[r][c] * out[c] for c in range(r + 1, n))) / a[r][r]
    return out if all(math.isfinite(v) for v in out) else None


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
