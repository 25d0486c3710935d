"""The split of the shrink-in-GEMM op's time (bench/in_gemm_parts.py), from fixed timings."""

import pytest

from bench import in_gemm_parts


def test_parts_split_the_op_against_the_base_gemm_and_the_copy_floor():
    us = {"merged": 100.0, "gemm_ext": 110.0, "expand": 25.0, "in_gemm": 137.0, "copy": 12.5}
    p = in_gemm_parts.parts(us)
    assert p == {"appended_columns_pct": 10.0, "expand_pct": 25.0, "rest_pct": 2.0, "in_gemm_pct": 37.0,
                 "copy_floor_pct": 12.5, "expand_over_copy": 2.0}
    # the three parts add up to the whole op's extra
    assert p["appended_columns_pct"] + p["expand_pct"] + p["rest_pct"] == pytest.approx(p["in_gemm_pct"])


def test_the_copy_reference_copies_a_row_strided_view():
    torch = pytest.importorskip("torch")
    src = torch.randn(70, 160)
    dst = torch.empty(70, 130)
    in_gemm_parts.copy_columns(src[:, :130], dst)
    assert torch.equal(dst, src[:, :130])


def test_bad_counts_are_refused_before_anything_runs(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["in_gemm_parts.py", "--iters", "0"])
    with pytest.raises(SystemExit) as exit_info:
        in_gemm_parts.main()
    assert exit_info.value.code == 2
    assert "must be >= 1, got 0" in capsys.readouterr().err
