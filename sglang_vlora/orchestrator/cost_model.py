"""Cost estimates for the orchestrator, built only from measured numbers.

Two sources, one schema: a JSON file (benchmark results) or a measurement callable run
at start-up that returns the same structure. There is no built-in latency anywhere:
with neither source, :func:`load_cost_model` raises :class:`CostModelError`.

Schema ``sglang-vlora/cost-model/v1``::

    {
      "schema": "sglang-vlora/cost-model/v1",
      "measured_on": "free text: device, model, tool, date",          (optional)
      "token_latency_s": {
        "merge":   {"prefill_forward": 0.050, "prefill_token": 2.0e-5, "decode_step": 0.0110},
        "mixture": {"prefill_forward": 0.052, "prefill_token": 2.3e-5, "decode_step": 0.0118},
        "unmerge": {"prefill_forward": 0.055, "prefill_token": 2.9e-5, "decode_step": 0.0135}
      },                                           (each prefill_forward optional)
      "switch_s": {
        "merge":   [{"rank": 16, "layers": 32, "seconds": 0.0029}, ...],
        "unmerge": [{"rank": 16, "layers": 32, "seconds": 0.0029}, ...],
        "fused":   [{"rank": 32, "layers": 32, "seconds": 0.0031}, ...]   (optional)
      }
    }

``prefill_token`` is the marginal cost of one prompt token in a prefill (the slope of
prefill time against prompt tokens, not a whole iteration divided by its tokens) and
``prefill_forward`` the fixed time of one prefill forward (the intercept of that line:
an eager prefill forward's fixed cost is far above a graph-replayed decode step's and
nearly independent of its tokens; 0 when absent); ``decode_step`` the time of one
decode iteration (each request in it gains one token); all measured in the given mode
at the serving batch size. ``switch_s`` lists measured mode switches of one adapter over
``layers`` LoRA-targeted decoder layers: ``merge`` folds an adapter into clean weights,
``unmerge`` takes it out, ``fused`` goes from adapter a to adapter b in one pass and is
keyed by the stacked rank ``r_a + r_b``.

Each switch kind is fitted as ``seconds = layers * (per_layer + rank * per_layer_rank)``
(least squares, both coefficients kept non-negative): folding a delta reads and writes
every targeted weight once (the per-layer term) and computes ``B @ A`` (the rank term).
Without ``fused`` points a fused switch is estimated as an unmerge then a merge.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from sglang_vlora.orchestrator.iteration_fit import IterationFit
from sglang_vlora.orchestrator.state import Mode, Request, WeightState

SCHEMA = "sglang-vlora/cost-model/v1"
SWITCH_KINDS = ("merge", "unmerge", "fused")


class CostModelError(ValueError):
    """No cost source, or a source that does not follow the schema."""


@dataclass(frozen=True)
class SwitchFit:
    """Switch time of one kind as a function of adapter rank and layer count."""

    per_layer_s: float
    per_layer_rank_s: float

    def seconds(self, rank: int, layers: int) -> float:
        return layers * (self.per_layer_s + rank * self.per_layer_rank_s)

    @classmethod
    def fit(cls, points: Sequence[tuple[int, int, float]]) -> SwitchFit:
        """Least squares of per-layer seconds against rank over ``(rank, layers, seconds)``.

        A negative slope (noise on a memory-bound switch) falls back to the mean; a
        negative intercept to a line through the origin, so no rank gets a negative cost.
        """
        xs = [float(rank) for rank, _, _ in points]
        ys = [seconds / layers for _, layers, seconds in points]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mean_x) ** 2 for x in xs)
        if sxx == 0:
            return cls(mean_y, 0.0)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
        intercept = mean_y - slope * mean_x
        if slope < 0:
            return cls(mean_y, 0.0)
        if intercept < 0:
            return cls(0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs))
        return cls(intercept, slope)


@dataclass(frozen=True)
class CostModel:
    """Per-mode token latencies and switch times for a model with ``layers`` LoRA layers."""

    prefill_token_s: Mapping[Mode, float]
    prefill_forward_s: Mapping[Mode, float]
    decode_step_s: Mapping[Mode, float]
    merge: SwitchFit
    unmerge: SwitchFit
    fused: SwitchFit | None
    layers: int
    source: str

    def exec_s(self, request: Request, mode: Mode) -> float:
        """Expected time to finish ``request`` if it runs in ``mode`` from now on.

        A request with prompt tokens left is charged one prefill forward's fixed cost on
        top of its tokens. That is an upper bound when several requests share a forward:
        each of them is charged the whole fixed cost. (A prompt chunked over several
        forwards is still charged one.)
        """
        prefill = request.remaining_prefill_tokens
        return (
            (self.prefill_forward_s[mode] if prefill > 0 else 0.0)
            + prefill * self.prefill_token_s[mode]
            + request.remaining_decode_steps * self.decode_step_s[mode]
        )

    def switch_s(self, src: WeightState, dst: WeightState, ranks: Mapping[str, int]) -> float:
        """Time to move the weights from ``src`` to ``dst``.

        Only the adapter folded into the weights matters: merge and mixture of the same
        adapter share weights, so moving between them costs nothing.
        """
        old, new = src[1], dst[1]
        if old == new:
            return 0.0
        if old is None:
            return self.merge.seconds(_rank(ranks, new), self.layers)
        if new is None:
            return self.unmerge.seconds(_rank(ranks, old), self.layers)
        r_old, r_new = _rank(ranks, old), _rank(ranks, new)
        if self.fused is None:
            return self.unmerge.seconds(r_old, self.layers) + self.merge.seconds(r_new, self.layers)
        return self.fused.seconds(r_old + r_new, self.layers)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], layers: int, source: str = "dict") -> CostModel:
        """Validate ``data`` against the schema; ``layers`` is the served model's LoRA layer count."""
        if not isinstance(layers, int) or layers <= 0:
            raise CostModelError(f"{source}: layers must be a positive int, got {layers!r}")
        if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
            raise CostModelError(f'{source}: expected a JSON object with "schema": "{SCHEMA}"')
        latency = _field(data, "token_latency_s", Mapping, source)
        prefill, forward, decode = {}, {}, {}
        for mode in Mode:
            entry = _field(latency, mode.value, Mapping, f"{source}: token_latency_s")
            where = f"{source}: token_latency_s.{mode}"
            prefill[mode] = _seconds(entry.get("prefill_token"), f"{where}.prefill_token")
            forward[mode] = _seconds(entry.get("prefill_forward", 0.0), f"{where}.prefill_forward")
            decode[mode] = _seconds(entry.get("decode_step"), f"{where}.decode_step")
        switch = _field(data, "switch_s", Mapping, source)
        unknown = sorted(set(switch) - set(SWITCH_KINDS))
        if unknown:
            raise CostModelError(f"{source}: unknown switch kinds {unknown}; known: {list(SWITCH_KINDS)}")
        fits = {
            kind: _fit(switch[kind], f"{source}: switch_s.{kind}") for kind in SWITCH_KINDS if kind in switch
        }
        for kind in ("merge", "unmerge"):
            if kind not in fits:
                raise CostModelError(f"{source}: switch_s.{kind} is required")
        return cls(
            prefill,
            forward,
            decode,
            fits["merge"],
            fits["unmerge"],
            fits.get("fused"),
            layers,
            str(data.get("measured_on", source)),
        )

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], layers: int) -> CostModel:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CostModelError(f"cannot read cost model {os.fspath(path)!r}: {exc}") from exc
        return cls.from_dict(data, layers, source=os.fspath(path))


def load_cost_model(
    layers: int,
    path: str | os.PathLike[str] | None = None,
    measure: Callable[[], Mapping[str, Any]] | None = None,
) -> CostModel:
    """The cost model from ``path`` if given (no start-up cost), else from ``measure()``.

    ``measure`` runs the start-up measurement and returns a dict in the file schema.
    """
    if path is not None:
        return CostModel.from_file(path, layers)
    if measure is not None:
        return CostModel.from_dict(measure(), layers, source="start-up measurement")
    raise CostModelError(
        f"no cost model: give a JSON file in the {SCHEMA} schema (see "
        "sglang_vlora.orchestrator.cost_model) or a measurement callable that returns one"
    )


MISS_FACTOR = 2.0  # a sample under 1/2 or over 2x its fit's prediction is a miss
MISS_REFIT_SAMPLES = 4  # a miss makes the fit due once this many samples came since it
# An iteration over MISS_FACTOR x its fit's prediction and by more than this is a stall worth
# naming: something held the forward (a first launch's set-up, the host, a copy), not its work.
SLOW_MARGIN_S = 0.02
SLOW_KEPT = 32  # the slow iterations /vlora/status lists, the latest


class SlowIteration(NamedTuple):
    """An iteration that took over MISS_FACTOR x what its mode's fit predicts, by more than
    SLOW_MARGIN_S: when its timing was read (wall clock, s), its mode and work, its seconds
    and the fit's prediction."""
    at: float
    mode: Mode
    prefill_tokens: int
    decode_requests: int
    seconds: float
    predicted_s: float


class MeasuredCosts:
    """A cost model measured while serving, for a server started without a cost file.

    The server reports every iteration it timed (the mode it ran in, its prefill tokens,
    its decoding requests, its seconds) and every weight switch with its kind and rank;
    :meth:`snapshot` turns the last ``window`` of each into a :class:`CostModel`:

    * per mode, :class:`~sglang_vlora.orchestrator.iteration_fit.IterationFit` fits
      ``seconds = fixed + prefill_forward * [prefill_tokens > 0] + per_token *
      prefill_tokens + per_request * decode_requests``; ``prefill_token`` is the fitted
      per-token cost (the marginal cost of one more prompt token), ``prefill_forward``
      the fixed time of a prefill forward (``fixed + prefill_forward``: the fit at zero
      tokens, as the file schema's intercept), ``decode_step`` the fitted time of a
      decode iteration at the mode's mean decode batch (what each request in it waits
      for one token);
    * a mode not measured yet (or without a prefill / decode sample) is charged the
      slowest measured mode's figure (the estimate errs towards serving a request
      sooner), and before anything is measured execution costs 0 (credit = waiting time
      + switch);
    * switch fits as in the file schema; an unmeasured ``unmerge`` borrows the
      ``merge`` fit and vice versa (both read and write every targeted weight once);
      with neither, switches cost 0 until one is measured.

    A mode's fit is redone when its samples have doubled since the last fit (1, 2, 4, ...
    samples: early estimates improve fast) and then every ``refit_every`` new ones: a fit
    over the window is about a millisecond of Python, too much for every iteration of the
    scheduler's loop. It is also redone sooner when it is known to be wrong: after
    ``MISS_REFIT_SAMPLES`` new samples when one of them took less than half or more than
    twice what the fit predicts. A server's first iterations compile kernels (seconds for
    SGLang's warm-up prefill on an H200, ``bench/results/profile_cost_model_startup_samples_h200.json``);
    the first fits are made of little else, and the doubling rule alone kept such a fit for
    many iterations. Switch fits are redone after every switch.
    """

    def __init__(self, layers: int, window: int = 256, refit_every: int = 32) -> None:
        if layers <= 0 or window <= 0 or refit_every <= 0:
            raise CostModelError("layers, window and refit_every must be positive")
        self.layers = layers
        self._iterations = {mode: deque(maxlen=window) for mode in Mode}  # (tokens, requests, seconds)
        self._switch = {kind: deque(maxlen=window) for kind in SWITCH_KINDS}  # (rank, layers, seconds)
        self._refit_every = refit_every
        self._unfitted = dict.fromkeys(Mode, 0)  # iterations recorded since the mode's last fit
        self._misses = dict.fromkeys(Mode, 0)  # samples off the mode's fit by more than MISS_FACTOR
        self._snapshot: CostModel | None = None
        self.fits: dict[Mode, IterationFit] = {}
        self.slow: deque[SlowIteration] = deque(maxlen=SLOW_KEPT)
        self.slow_count = 0
        self.slow_excess_s = 0.0  # summed over every slow iteration: seconds minus predicted
        # per mode: (prefill_token, prefill_forward) if it ran a prefill, decode_step if it ran a decode step
        self._figures: dict[Mode, tuple[tuple[float, float] | None, float | None]] = {}

    def record_iteration(self, mode: Mode, prefill_tokens: int, decode_requests: int, seconds: float,
                         at: float = 0.0) -> None:
        """One timed forward iteration: ``prefill_tokens`` new prompt tokens (0 for a decode
        step) and ``decode_requests`` requests gaining one token (a mixed batch has both);
        ``at``: when its timing was read. One far slower than its mode's fit predicts, where the
        fit has seen such work, is kept as a :class:`SlowIteration` (a sample all the same: the
        fit sees what serving costs)."""
        if seconds <= 0 or not math.isfinite(seconds) or prefill_tokens < 0 or decode_requests < 0:
            return
        if prefill_tokens == decode_requests == 0:
            return
        mode = Mode(mode)
        self._iterations[mode].append((prefill_tokens, decode_requests, seconds))
        self._unfitted[mode] += 1
        fit = self.fits.get(mode)
        if fit is not None:
            predicted = fit.seconds(prefill_tokens, decode_requests)
            if not predicted / MISS_FACTOR <= seconds <= predicted * MISS_FACTOR:
                self._misses[mode] += 1
            if (seconds > predicted * MISS_FACTOR and seconds - predicted > SLOW_MARGIN_S
                    and self._fit_has_seen(mode, prefill_tokens, decode_requests)):
                self.slow.append(SlowIteration(at, mode, prefill_tokens, decode_requests, seconds, predicted))
                self.slow_count += 1
                self.slow_excess_s += seconds - predicted
        if self._due(mode):
            self._snapshot = None

    def _fit_has_seen(self, mode: Mode, prefill_tokens: int, decode_requests: int) -> bool:
        """Whether ``mode``'s fit was made of work like this: a fit of decode steps alone
        predicts nothing for a prefill (0 s for 1500 tokens, seen on the H200), so a prefill
        is judged only by a fit that saw prefills, a decode step by one that saw decode steps."""
        prefill, decode = self._figures.get(mode, (None, None))
        return (prefill_tokens == 0 or prefill is not None) and (decode_requests == 0 or decode is not None)

    def _due(self, mode: Mode) -> bool:
        fit = self.fits.get(mode)
        if fit is None:
            return True
        if self._misses[mode] and self._unfitted[mode] >= MISS_REFIT_SAMPLES:
            return True
        return self._unfitted[mode] >= min(self._refit_every, fit.samples)

    def record_switch(self, kind: str, rank: int, seconds: float) -> None:
        """One weight switch of ``kind`` (merge, unmerge, fused; fused keyed by r_a + r_b)."""
        if kind not in SWITCH_KINDS:
            raise CostModelError(f"unknown switch kind {kind!r}; known: {list(SWITCH_KINDS)}")
        if seconds < 0 or not math.isfinite(seconds) or rank <= 0:
            return
        self._switch[kind].append((rank, self.layers, seconds))
        self._snapshot = None

    def recent_iterations(self, last: int = 16) -> dict[Mode, list[tuple[int, int, float]]]:
        """Per mode with samples, its last ``last`` timed iterations ``(prefill tokens, decode
        requests, seconds)``, oldest first: what the fit is made of (``/vlora/status``)."""
        return {mode: list(points)[-last:] for mode, points in self._iterations.items() if points}

    def measured_switches(self) -> int:
        return sum(len(points) for points in self._switch.values())

    def snapshot(self) -> CostModel:
        if self._snapshot is None:
            for mode, points in self._iterations.items():
                if points and self._due(mode):
                    self._refit(mode)
            prefill = {m: p[0] for m, (p, _) in self._figures.items() if p is not None}
            forward = {m: p[1] for m, (p, _) in self._figures.items() if p is not None}
            decode = {m: d for m, (_, d) in self._figures.items() if d is not None}
            fits = {kind: SwitchFit.fit(list(pts)) for kind, pts in self._switch.items() if pts}
            free = SwitchFit(0.0, 0.0)
            merge = fits.get("merge", fits.get("unmerge", free))
            self._snapshot = CostModel(
                _fill_modes(prefill),
                _fill_modes(forward),
                _fill_modes(decode),
                merge,
                fits.get("unmerge", merge),
                fits.get("fused"),
                self.layers,
                "measured while serving",
            )
        return self._snapshot

    def _refit(self, mode: Mode) -> None:
        """The mode's fit, its per-token and fixed prefill costs (if it ran a prefill) and
        its decode step at its mean decode batch (if it ran a decode step)."""
        points = list(self._iterations[mode])
        fit = IterationFit.fit(points)
        self.fits[mode] = fit
        self._unfitted[mode] = 0
        self._misses[mode] = 0
        ran_prefill = any(tokens for tokens, _, _ in points)
        prefill = (fit.prefill_token_s, fit.fixed_s + fit.prefill_forward_s) if ran_prefill else None
        decoding = [requests for tokens, requests, _ in points if requests and not tokens]
        decode = fit.seconds(0, round(sum(decoding) / len(decoding))) if decoding else None
        self._figures[mode] = (prefill, decode)


class OutputLengths:
    """Expected output length of a request, learned from finished ones.

    ``max_new_tokens`` is only a cap (an OpenAI request without ``max_tokens`` has none
    below the context length), and charging it as the expected length makes every
    request look starving. So a request is expected to produce the mean output length
    of the last ``window`` finished requests of its group (its application, else its
    adapter), at most its cap; a group with nothing finished yet is expected to produce
    its cap, or, without one, what it has produced so far plus one token.
    """

    def __init__(self, window: int = 64) -> None:
        self._window = window
        self._done: dict[str | None, deque[int]] = {}
        # per group, the rounded mean of its window: read for every request every iteration,
        # changed only when a request finishes, so it is computed then
        self._mean: dict[str | None, int] = {}

    def record(self, group: str | None, tokens: int) -> None:
        done = self._done.setdefault(group, deque(maxlen=self._window))
        done.append(max(0, tokens))
        self._mean[group] = round(sum(done) / len(done))

    def expected(self, group: str | None, cap: int | None, so_far: int) -> int:
        mean = self._mean.get(group)
        if mean is not None:
            guess = mean if cap is None else min(cap, mean)
        else:
            guess = cap if cap is not None else so_far + 1
        return max(guess, so_far)


def _fill_modes(measured: Mapping[Mode, float]) -> dict[Mode, float]:
    slowest = max(measured.values(), default=0.0)
    return {mode: measured.get(mode, slowest) for mode in Mode}


def _rank(ranks: Mapping[str, int], adapter: str) -> int:
    try:
        return ranks[adapter]
    except KeyError:
        raise CostModelError(
            f"no rank known for adapter {adapter!r}: pass it in SchedulerState.ranks"
        ) from None


def _field(data: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise CostModelError(f"{where}: missing or malformed field {key!r}")
    return value


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise CostModelError(f"{where}: expected a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _fit(points: Any, where: str) -> SwitchFit:
    if not isinstance(points, list) or not points:
        raise CostModelError(f"{where}: expected a non-empty list of {{rank, layers, seconds}}")
    parsed = []
    for i, point in enumerate(points):
        if not isinstance(point, Mapping):
            raise CostModelError(f"{where}[{i}]: expected an object")
        rank, layers = point.get("rank"), point.get("layers")
        for name, value in (("rank", rank), ("layers", layers)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise CostModelError(f"{where}[{i}].{name}: expected a positive int, got {value!r}")
        parsed.append((rank, layers, _seconds(point.get("seconds"), f"{where}[{i}].seconds")))
    return SwitchFit.fit(parsed)
