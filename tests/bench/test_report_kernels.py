"""The kernel report's choice of ATMM entry point per cell, with and without the in-GEMM method."""

from bench import report


def _row(mode: str, tokens: int, extra: dict[str, float], shape: str = "proj") -> dict:
    peers = {"sglang_triton": 90.0, "sglang_csgmv": 80.0, "bmm": 120.0}
    errs = {m: 0.004 for m in extra}
    return {"shape": shape, "mode": mode, "tokens": tokens, "rank": 64, "adapters": 1,
            "extra_pct": {**extra, **peers}, "err": errs, "us": {"merged": 10.0}}


def test_decode_targets_take_the_better_graph_safe_entry_point_when_the_in_gemm_method_ran():
    old = _row("decode", 8, {"atmm": 50.0, "atmm_overlap": 40.0})
    new = _row("decode", 8, {"atmm": 50.0, "atmm_overlap": 40.0, "atmm_in_gemm": 25.0})
    prefill = _row("prefill", 4096, {"atmm": 15.0, "atmm_overlap": 30.0, "atmm_in_gemm": 8.0})
    assert report._best_graph(old) == 40.0 and report._best_graph(new) == 25.0
    assert report._best_triton(prefill) == 8.0
    assert report._targets_met([old]).startswith("0 of 0 prefill cells (0 at the 10% stretch) and 0 of 1 decode")
    assert report._targets_met([old, new, prefill]).startswith(
        "1 of 1 prefill cells (1 at the 10% stretch) and 1 of 2 decode cells"
    )


def test_the_prefill_target_is_20_percent_at_rank_64_with_a_10_percent_stretch():
    at_target = _row("prefill", 4096, {"atmm": 25.0, "atmm_overlap": 30.0, "atmm_in_gemm": 19.5})
    above = _row("prefill", 1024, {"atmm": 21.0, "atmm_overlap": 30.0, "atmm_in_gemm": 24.0})
    other_rank = {**_row("prefill", 4096, {"atmm": 5.0, "atmm_overlap": 6.0}), "rank": 8}
    assert report._targets_met([at_target, above, other_rank]).startswith(
        "1 of 2 prefill cells (0 at the 10% stretch)"
    )


def test_a_failed_in_gemm_cell_is_left_out_of_the_best_and_the_error():
    row = _row("decode", 8, {"atmm": 50.0, "atmm_overlap": 40.0, "atmm_in_gemm": None})
    row["err"]["atmm_in_gemm"] = "RuntimeError: out of memory"
    assert report._best_graph(row) == 40.0
    assert report._max_err([row]) == 0.004


def test_the_rank64_table_shows_a_failed_cell_as_a_dash():
    ok = _row("decode", 8, {"atmm": 50.0, "atmm_overlap": 40.0, "atmm_in_gemm": 25.0})
    failed = _row("decode", 32, {"atmm": 50.0, "atmm_overlap": 45.0, "atmm_in_gemm": None})
    lines = report.kernels_rank64({"rows": [ok]}, {"rows": [failed]}).splitlines()
    assert "ATMM shrink in the GEMM %" in lines[0]
    assert "| **25** |" in lines[2] and "| **45** | - |" in lines[3]


def test_the_rounds_table_counts_cells_by_the_best_median_and_shows_each_rounds_extra():
    def cell(tokens: int, merged: list[float], gemm: list[float], median: float) -> dict:
        return {"shape": "gate_up", "tokens": tokens, "adapters": 1, "us": {"merged": sorted(merged)[1]},
                "extra_pct": {"atmm_gemm": median}, "rounds_us": {"merged": merged, "atmm_gemm": gemm}}

    run = {"rows": [cell(4096, [100.0, 110.0, 120.0], [108.0, 121.0, 126.0], 10.0),
                    cell(1024, [10.0, 10.0, 10.0], [12.5, 12.0, 12.2], 22.0)]}
    text = report.kernels_prefill_rounds(run)
    assert "| gate_up 4096x1 | 110.0 (100-120) | 10.0 (5.0-10.0) | 10.0 |" in text
    assert "| gate_up 1024x1 | 10.0 (10-10) | 22.0 (20.0-25.0) | 22.0 |" in text
    assert "at most 20% in 1 of 2 cells and at most 10% in 1." in text
