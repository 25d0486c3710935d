"""Workload generators: determinism, popularity skew, Poisson rate, video chunks, trace parsing."""

from __future__ import annotations

import base64
import io
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench import workloads
from bench.traces.make_trace import main as make_trace

ADAPTERS = ["a8", "b16", "c32", "d64"]


def test_retrieval_is_deterministic_from_its_seed():
    a = workloads.visual_retrieval(ADAPTERS, rate=5, duration_s=4, seed=3)
    b = workloads.visual_retrieval(ADAPTERS, rate=5, duration_s=4, seed=3)
    c = workloads.visual_retrieval(ADAPTERS, rate=5, duration_s=4, seed=4)
    assert a == b
    assert [r.arrival_s for r in a] != [r.arrival_s for r in c]


def test_retrieval_requests_are_well_formed():
    reqs = workloads.visual_retrieval(ADAPTERS, rate=20, duration_s=3, seed=0, output_tokens={"vqa": 3})
    assert {r.task for r in reqs} == set(workloads.RETRIEVAL_TASKS)
    assert all(b.arrival_s >= a.arrival_s for a, b in zip(reqs, reqs[1:], strict=False))
    for r in reqs:
        assert r.application == "visual_retrieval" and r.adapter in ADAPTERS
        assert r.payload["lora_path"] == r.adapter
        assert r.payload["text"].count("<|image_pad|>") == 1
        assert r.payload["sampling_params"]["max_new_tokens"] == r.expected_output_tokens
        expected = 3 if r.task == "vqa" else workloads.OUTPUT_TOKENS[r.task]
        assert r.expected_output_tokens == expected
        png = base64.b64decode(r.payload["image_data"].split(",", 1)[1])
        assert Image.open(io.BytesIO(png)).size[0] in workloads.IMAGE_SIZES
    assert any("Circle the" in r.payload["text"] for r in reqs if r.task == "referring_expression")


@pytest.mark.parametrize("skew", [0.25, 0.6, 0.9])
def test_most_requested_adapter_gets_its_share(skew):
    adapters = [f"x{i}" for i in range(8)]
    reqs = workloads.visual_retrieval(adapters, rate=500, duration_s=8, skew=skew, seed=1, max_requests=3000,
                                      image_sizes=(28,))
    counts = Counter(r.adapter for r in reqs)
    assert len(reqs) == 3000
    assert abs(counts["x0"] / len(reqs) - skew) < 0.03
    # The rest follow the power law: each less requested than the one before (within noise).
    shares = workloads.popularity(8, skew)
    assert shares.sum() == pytest.approx(1.0)
    assert np.all(np.diff(shares[1:]) < 0)
    assert counts.most_common(1)[0][0] == "x0"


def test_uniform_popularity_and_image_sizes():
    assert workloads.popularity(4, 0.25, alpha=0.0).tolist() == [0.25] * 4
    with pytest.raises(ValueError, match="multiples of 28"):
        workloads.visual_retrieval(ADAPTERS, rate=5, duration_s=1, image_sizes=(100,))
    reqs = workloads.visual_retrieval(ADAPTERS, rate=20, duration_s=1, seed=0, image_sizes=(448,))
    png = base64.b64decode(reqs[0].payload["image_data"].split(",", 1)[1])
    assert Image.open(io.BytesIO(png)).size == (448, 448)  # 256 visual tokens in Qwen2-VL


def test_popularity_rejects_bad_values():
    with pytest.raises(ValueError, match="at least one"):
        workloads.popularity(0, 0.5)
    with pytest.raises(ValueError, match="share"):
        workloads.popularity(4, 1.5)
    with pytest.raises(ValueError, match="adapter 2"):
        workloads.popularity(2, 0.3)  # the second adapter would be the most requested
    assert workloads.popularity(1, 0.3).tolist() == [1.0]


def test_poisson_rate_and_exponential_gaps():
    rng = np.random.default_rng(0)
    times = workloads.poisson_arrivals(rng, rate=4.0, duration_s=2500)
    assert abs(len(times) / 2500 - 4.0) < 0.1
    gaps = np.diff(times)
    assert abs(gaps.mean() - 0.25) < 0.01
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05  # coefficient of variation 1: exponential
    with pytest.raises(ValueError):
        workloads.poisson_arrivals(rng, rate=0, duration_s=1)


def test_video_chunks_streams_and_heads():
    reqs = workloads.video_analytics(["a8", "b16"], streams=3, duration_s=2, seed=0, head_adapters=["b16"],
                                     detection_stride=10)
    assert reqs == workloads.video_analytics(["a8", "b16"], streams=3, duration_s=2, seed=0,
                                             head_adapters=["b16"], detection_stride=10)
    per_chunk = Counter((r.stream, r.meta["chunk"]) for r in reqs)
    assert set(per_chunk.values()) == {30 // 10 + 1}  # 3 detections + 1 understanding per chunk
    assert {s for s, _ in per_chunk} == {0, 1, 2}
    for r in reqs:
        assert r.adapter == ["a8", "b16"][r.stream % 2]
        if r.task == "video_understanding":
            assert len(r.payload["image_data"]) == 6 and r.payload["text"].count("<|image_pad|>") == 6
            head = r.adapter == "b16"
            assert r.meta["head"] is head
            assert (r.payload["sampling_params"].get("custom_params") == {"vlora_head": True}) is head
            assert r.expected_output_tokens == (1 if head else workloads.OUTPUT_TOKENS["video_understanding"])
        else:
            assert r.task == "object_detection" and r.payload["text"].count("<|image_pad|>") == 1
    # Chunks of one stream arrive one second apart.
    stream0 = sorted({r.arrival_s for r in reqs if r.stream == 0})
    assert np.allclose(np.diff(stream0), 1.0)


def test_video_chunk_period_spaces_the_chunks():
    reqs = workloads.video_analytics(["a8"], streams=1, duration_s=10, seed=1, detection_stride=30,
                                     frame_size=56, chunk_period_s=2.0)
    arrivals = sorted({r.arrival_s for r in reqs})
    assert np.allclose(np.diff(arrivals), 2.0) and len(arrivals) == 5  # a chunk every 2 s for 10 s
    assert arrivals[0] < 2.0 and arrivals[-1] < 10.0
    assert len(reqs) == 2 * 5  # one detection (stride 30) + one understanding per chunk


def test_video_rejects_bad_input():
    with pytest.raises(ValueError, match="not among"):
        workloads.video_analytics(["a8"], streams=1, duration_s=1, head_adapters=["zz"])
    with pytest.raises(ValueError, match="stride"):
        workloads.video_analytics(["a8"], streams=1, duration_s=1, detection_stride=0)
    with pytest.raises(ValueError, match="unknown task"):
        workloads.video_analytics(["a8"], streams=1, duration_s=1, output_tokens={"nope": 2})
    with pytest.raises(ValueError, match="chunk_period_s"):
        workloads.video_analytics(["a8"], streams=1, duration_s=1, chunk_period_s=0)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_trace_parsing_azure_timestamps(tmp_path):
    trace = write(tmp_path / "t.csv", (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:48.1234567,100,7\n"
        "2023-11-16 18:15:46.6805900,4808,10\n"
        "2023-11-16 18:15:47.6805900,20,1\n"
    ))
    rows = workloads.read_trace(trace)
    assert [r.context_tokens for r in rows] == [4808, 20, 100]
    assert [r.arrival_s for r in rows][:2] == [0.0, pytest.approx(1.0)]
    assert rows[2].arrival_s == pytest.approx(1.442866, abs=1e-6)
    reqs = workloads.trace_replay(trace, ["a8", "b16"], max_context_tokens=50, max_output_tokens=8, seed=2)
    assert [len(r.payload["input_ids"]) for r in reqs] == [50, 20, 50]
    assert [r.expected_output_tokens for r in reqs] == [8, 1, 7]
    assert all(32 <= t < 256 for r in reqs for t in r.payload["input_ids"])
    # Rescaled to 4 requests/s: 3 arrivals span (3 - 1) / 4 s.
    fast = workloads.trace_replay(trace, ["a8", "b16"], rate=4.0)
    assert fast[-1].arrival_s == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("TIMESTAMP,ContextTokens\n1,2\n", "missing column"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,5\n", ":2: bad row"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,5\n1,5,x\n", ":3: bad row"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,0,5\n", ">= 1"),
    ],
)
def test_trace_rejects_bad_files(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        workloads.read_trace(write(tmp_path / "bad.csv", text))


def test_shipped_trace_is_what_the_script_writes(tmp_path):
    shipped = Path(workloads.__file__).parent / "traces" / "synthetic_azure.csv"
    make_trace(["--out", str(tmp_path / "again.csv")])
    assert (tmp_path / "again.csv").read_text() == shipped.read_text()
    rows = workloads.read_trace(shipped)
    assert 100 <= len(rows) <= 1000
    reqs = workloads.trace_replay(shipped, ADAPTERS, skew=0.9, seed=0)
    assert Counter(r.adapter for r in reqs).most_common(1)[0][0] == "a8"


@pytest.mark.parametrize("flags", [["--chunk-period", "0"], ["--detection-stride", "0"]])
def test_the_client_refuses_a_bad_video_parameter_by_name(flags, capsys):
    from bench.client import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--url", "http://127.0.0.1:9", "--workload", "video", "--adapters", "a8", "--duration", "1", *flags])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and ("chunk_period_s" in err or "detection_stride" in err)
