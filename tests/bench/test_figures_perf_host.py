"""bench/figures_perf.py's per-module host table of a sampled small prefill."""

from __future__ import annotations

import pytest

from bench.figures_perf import perf_host_modules


def _modules(qkv: float, qkv_base: tuple[str, float], o: float, o_base: tuple[str, float]) -> dict:
    return {"qkv": {"ms": qkv, "top_leaves_ms": dict([qkv_base, ("other (x.py:1)", 9.0)])},
            "o": {"ms": o, "top_leaves_ms": dict([o_base])},
            "gate_up": {"ms": 1.3, "top_leaves_ms": {}}, "down": {"ms": 0.3, "top_leaves_ms": {}}}


@pytest.mark.parametrize("ours", ["lora_apply_static_in_gemm (atmm/ops.py:271)", "KeptInGemmCall.__call__ (atmm/ops.py:326)"])
def test_the_table_names_each_module_and_the_line_of_its_base_gemm(ours: str) -> None:
    sglang = "UnquantizedLinearMethod.apply (quantization/unquant.py:614)"
    latency = {k: {"count": 100, "server_forward_ms": {"median": m},
                   **({} if k == "nolora" else {"over_floor": {"median": d, "p25": d - 1, "p75": d + 1}})}
               for k, m, d in (("nolora", 56.6, 0), ("nolora2", 57.4, 1.0), ("atmm", 66.4, 7.8), ("csgmv", 65.8, 13.8))}
    host = {"nolora": {"event_loop_ms": 42.4, "module_calls": _modules(1.0, (sglang, 0.9), 1.3, (sglang, 0.94))},
            "nolora2": {"event_loop_ms": 40.7, "module_calls": _modules(0.9, (sglang, 0.88), 1.2, (sglang, 0.86))},
            "atmm": {"event_loop_ms": 48.6, "module_calls": _modules(2.8, (ours, 1.58), 3.0, (ours, 2.06))},
            "csgmv": {"event_loop_ms": 52.0, "module_calls": _modules(5.1, (sglang, 1.48), 4.7, (sglang, 2.24))}}
    text = perf_host_modules({"interleaved_latency": {"prefill16": latency},
                              "host_samples": {"prefill16": {"systems": host}}})
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert rows["client latency over the floor's, median a round (p25 to p75)"].endswith(
        "| - | +1.0 (+0.0 to +2.0) | +7.8 (+6.8 to +8.8) | +13.8 (+12.8 to +14.8) |")
    # the base GEMM's own line, not the module's other lines (9.0 ms in "other")
    assert rows["q/k/v module call (its base GEMM's line)"].endswith("| 1.00 (0.90) | 0.90 (0.88) | 2.80 (1.58) | 5.10 (1.48) |")
    assert rows["o module call (its base GEMM's line)"].endswith("| 1.30 (0.94) | 1.20 (0.86) | 3.00 (2.06) | 4.70 (2.24) |")
    assert "over 100 rounds" in text


def test_a_module_without_a_base_gemm_line_reads_as_a_dash() -> None:
    latency = {k: {"count": 3, "server_forward_ms": {"median": 50.0}} for k in ("nolora", "nolora2", "atmm", "csgmv")}
    calls = {"qkv": {"ms": 1.0, "top_leaves_ms": {"other (x.py:1)": 1.0}}, "o": {"ms": 1.0, "top_leaves_ms": {}},
             "gate_up": {"ms": 1.0, "top_leaves_ms": {}}, "down": {"ms": 1.0, "top_leaves_ms": {}}}
    host = {k: {"event_loop_ms": 40.0, "module_calls": calls} for k in latency}
    text = perf_host_modules({"interleaved_latency": {"prefill16": latency},
                              "host_samples": {"prefill16": {"systems": host}}})
    assert "| q/k/v module call (its base GEMM's line) | 1.00 (-) | 1.00 (-) | 1.00 (-) | 1.00 (-) |" in text


def test_the_prefill1_table_reads_its_own_scenario_with_a_column_per_system() -> None:
    from bench.figures_perf import perf_host_modules_prefill1

    ours = "KeptInGemmCall.__call__ (atmm/ops.py:313)"
    systems = ("nolora", "nolora2", "atmm", "atmm_no_small_gemm", "csgmv")
    latency = {k: {"count": 100, "server_forward_ms": {"median": 58.0 + i},
                   **({} if k == "nolora" else {"over_floor": {"median": float(i), "p25": i - 1.0, "p75": i + 1.0}})}
               for i, k in enumerate(systems)}
    host = {k: {"event_loop_ms": 40.0 + i, "module_calls": _modules(1.0 + i, (ours, 0.5 + i), 2.0, (ours, 0.25))}
            for i, k in enumerate(systems)}
    other = {"count": 1, "server_forward_ms": {"median": 1.0}}  # a scenario the table must not read
    text = perf_host_modules_prefill1({"interleaved_latency": {"prefill1": latency, "prefill1_base": {k: other for k in systems}},
                                       "host_samples": {"prefill1": {"systems": host}}})
    lines = text.splitlines()
    assert lines[0] == "| | no LoRA | no LoRA, control | ATMM | ATMM, no one kernel | csgmv |"
    assert "| server forward, median | 58.0 | 59.0 | 60.0 | 61.0 | 62.0 |" in lines
    assert "| q/k/v module call (its base GEMM's line) | 1.00 (0.50) | 2.00 (1.50) | 3.00 (2.50) | 4.00 (3.50) | 5.00 (4.50) |" in lines
    assert "over 100 rounds" in text
