"""The per-mode layer benchmark runs each mode on the batch it claims to and gets the
unmerged outputs back (fp32, small shapes; the kernels through Triton's interpreter in CI)."""

from __future__ import annotations

import pytest
import torch

from bench import mode_cost


def test_segments_group_the_merged_adapters_requests_first() -> None:
    starts, lens, slots = mode_cost.segments(16, 8, 0.5)
    assert slots == [0, 1, 2, 3] and lens == [64, 32, 16, 16] and starts == [0, 64, 96, 112]
    assert mode_cost.segments(1, 4, 1.0) == ([0], [4], [0])  # all on k: one segment
    assert mode_cost.segments(1, 3, 0.0) == ([0, 1, 2], [1, 1, 1], [1, 2, 3])


@pytest.mark.parametrize(("tokens", "requests", "share"), [(8, 4, 1.0), (8, 4, 0.5), (1, 4, 0.25)])
def test_every_mode_reproduces_the_unmerged_outputs(tokens: int, requests: int, share: float) -> None:
    gen = torch.Generator().manual_seed(1)
    projections = {n: mode_cost.Projection(h, s, 8, torch.float32, torch.device("cpu"), gen)
                   for n, (h, s) in mode_cost.SHAPES_SMOKE.items()}
    row = mode_cost.measure(projections, tokens, requests, share, torch.device("cpu"), torch.float32, 1, gen)
    assert row["unmerge_rel_err"] == 0.0
    assert row["mixture_rel_err"] < 1e-5
    if share == 1.0:
        assert row["items"]["mixture"] == 0 and row["merge_rel_err"] < 1e-5  # merge: no LoRA work at all
    else:
        # the deLoRA terms of the other adapters coalesce into one item: as many items as unmerged
        assert "merge_ms" not in row and row["items"]["mixture"] == row["items"]["unmerge"]
    # the adapters matter: the base GEMMs alone are far from the unmerged outputs
    x = torch.randn(tokens * requests, 64, generator=gen)
    items = mode_cost.mode_work_items(*mode_cost.segments(tokens, requests, share), [8] * 4, [2.0] * 4, None)
    assert mode_cost.rel_err(mode_cost.layer(projections, x, False, None),
                             mode_cost.layer(projections, x, False, items)) > 1e-2


@pytest.mark.parametrize("flags", [["--batches", "12"], ["--batches", "0x4"], ["--shares", "1.5"], ["--rank", "0"],
                                   ["--iters", "-1"]])
def test_bad_flags_are_refused_with_their_name(flags: list[str], monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.argv", ["mode_cost.py", "--smoke", *flags])
    with pytest.raises(SystemExit) as exit_info:
        mode_cost.main()
    assert exit_info.value.code == 2 and flags[0] in capsys.readouterr().err
