"""The graph-step benchmark times what computes the LoRA: its side-stream, in-sequence and
shrink-in-GEMM forwards give the torch path's outputs (fp32, small shapes; the kernels through Triton's
interpreter in CI), on unmerged and mixture batches."""

from __future__ import annotations

import pytest
import torch

from bench import graph_step


@pytest.mark.parametrize(("tokens", "requests", "mode", "slots"),
                         [(1, 4, "unmerged", 4), (1, 4, "mixture", 4), (6, 1, "unmerged", 4), (1, 4, "mixture", 6)])
def test_timed_variants_compute_the_lora(tokens: int, requests: int, mode: str, slots: int) -> None:
    gen = torch.Generator().manual_seed(2)
    shapes = graph_step.SHAPES_SMOKE
    slices = {"qkv": shapes["qkv"], "o": shapes["o"]}
    layers = [graph_step.Layer(shapes["hidden"], slices, 8, slots, torch.float32, torch.device("cpu"), gen)
              for _ in range(shapes["layers"])]
    row = graph_step.measure(layers, shapes, tokens, requests, 0.5, mode, torch.device("cpu"), torch.float32, 1, 1,
                             gen, None)
    assert row["items"] > 0
    assert all(row[f"{v}_rel_err"] < 1e-5 for v in graph_step.VARIANTS)
    assert set(row) >= {f"{v}_adds_ms" for v in graph_step.VARIANTS}


def test_the_error_sees_a_wrong_delta() -> None:
    ref, base = [torch.ones(2, 3)], [torch.zeros(2, 3)]
    assert graph_step.rel_err([torch.ones(2, 3)], ref, base) == 0.0
    assert graph_step.rel_err([torch.zeros(2, 3)], ref, base) == pytest.approx(1.0)


@pytest.mark.parametrize("flags", [["--batches", "12"], ["--batches", "0x4"], ["--share", "1.5"], ["--rank", "0"],
                                   ["--trials", "0"], ["--slots", "2"]])
def test_bad_flags_are_refused_with_their_name(flags: list[str], monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.argv", ["graph_step.py", "--smoke", *flags])
    with pytest.raises(SystemExit) as exit_info:
        graph_step.main()
    assert exit_info.value.code == 2 and flags[0] in capsys.readouterr().err
