"""bench/kernels.py --rounds: the methods of a cell take turns, and a failing one is recorded once."""

from __future__ import annotations

from bench.kernels import checked_error, time_in_turns


class FakeCell:
    """Each call returns the next of its method's times; ``broken`` raises."""

    def __init__(self, times: dict[str, list[float]], broken: str) -> None:
        self.times, self.broken, self.calls = times, broken, []

    def time_us(self, method: str, iters: int) -> float:
        self.calls.append(method)
        if method == self.broken:
            raise RuntimeError("no kernel for this shape")
        return self.times[method].pop(0)


def test_methods_take_turns_and_a_failure_is_timed_once() -> None:
    cell = FakeCell({"merged": [10.0, 11.0, 12.0], "atmm": [13.0, 14.0, 15.0]}, broken="bmm")
    errors: dict[str, str] = {}
    times = time_in_turns(cell, ["merged", "atmm", "bmm"], rounds=3, iters=5, errors=errors)
    assert cell.calls == ["merged", "atmm", "bmm", "merged", "atmm", "merged", "atmm"]
    assert times == {"merged": [10.0, 11.0, 12.0], "atmm": [13.0, 14.0, 15.0], "bmm": []}
    assert errors == {"bmm": "RuntimeError: no kernel for this shape"}


def test_an_error_check_that_raises_is_recorded_not_raised() -> None:
    class Cell:
        def rel_error(self, method: str) -> float:
            if method == "sglang_csgmv":
                raise ValueError("shape not supported")
            return 0.0041234

    assert checked_error(Cell(), "atmm") == 0.00412
    assert checked_error(Cell(), "sglang_csgmv") == "ValueError: shape not supported"
