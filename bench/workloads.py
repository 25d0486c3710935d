"""Request workloads of the paper's end-to-end evaluation (§6.1), deterministic from a seed.

A workload is a list of :class:`Request` (plain dataclasses, sorted by arrival time) that
:mod:`bench.client` sends open-loop to SGLang's ``/generate``. Three generators:

* :func:`visual_retrieval`: Poisson arrivals at ``rate`` requests/s; each request is one
  image (a PNG made here, 448 or 672 px by default: 256 or 576 visual tokens in Qwen2-VL)
  with a referring-expression, VQA or captioning prompt from :mod:`sglang_vlora.prompts`; the adapter is drawn from a skewed
  popularity law (:func:`popularity`).
* :func:`video_analytics`: ``streams`` cameras, each sending one chunk of 30 frames per
  second (448 px frames by default); every ``detection_stride``-th frame becomes an
  object-detection request and the chunk's 6 uniformly sampled frames one
  video-understanding request. Each stream is bound
  to one adapter (round-robin over the adapters); for adapters in ``head_adapters`` the
  video-understanding request asks for the adapter's task head
  (``custom_params {"vlora_head": true}``: one forward pass, 1 output token). Detection
  always decodes (boxes are text).
* :func:`trace_replay`: arrival times and token counts from a trace in the format of the
  Azure LLM inference trace 2023, adapters drawn from the popularity law.

Trace format (CSV with a header row, one request per row, any row order)::

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,4808,10
    2023-11-16 18:15:50.9951690,3180,8

``TIMESTAMP`` is an ISO date-time (the Azure files use 7 fractional digits; extra digits
are truncated to microseconds) or a number of seconds; arrivals are taken relative to the
earliest row. ``ContextTokens`` (>= 1) and ``GeneratedTokens`` (>= 1) are integers. The
Azure trace carries no content, so replayed requests are text-only and send
``input_ids`` of exactly ``ContextTokens`` ids (drawn from ``token_ids``, a range that is
an ordinary-token range of both the tiny model and Qwen2 tokenizers) with
``max_new_tokens = GeneratedTokens``. ``bench/traces/make_trace.py`` writes a small
synthetic trace in this format.

Prompts with images are rendered in Qwen2-VL's chat format (one
``<|vision_start|><|image_pad|><|vision_end|>`` per image), the served model family.
Output lengths are enforced with ``ignore_eos`` so that a request produces the tokens the
workload expects, as serving benchmarks usually do.
"""

from __future__ import annotations

import base64
import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from sglang_vlora.prompts import build_messages, templates

RETRIEVAL_TASKS = ("referring_expression", "vqa", "captioning")
# Expected output tokens per task: a box answer, a short answer, a sentence, several boxes, a label.
OUTPUT_TOKENS = {
    "referring_expression": 24,
    "vqa": 8,
    "captioning": 32,
    "object_detection": 48,
    "video_understanding": 8,
}
# End-to-end latency SLO per application, seconds. Video: a chunk must be done before the next one.
SLO_S = {"visual_retrieval": 2.0, "video_analytics": 1.0, "trace": 5.0}
# Multiples of 28 (Qwen2-VL's processor keeps them as they are): 448 px is 256 visual tokens, 672 px 576.
IMAGE_SIZES = (448, 672)
FRAME_SIZE = 448
FRAMES_PER_CHUNK = 30
UNDERSTANDING_FRAMES = 6

_TARGETS = ("person", "car", "dog", "red umbrella", "traffic light", "bicycle")
_QUESTIONS = ("What is in the image?", "How many people are there?", "Is it night?", "What color is the car?")
_CATEGORIES = ("person", "car", "bicycle", "bus")


@dataclass
class Request:
    """One request of a workload. ``payload`` is the JSON body for ``/generate``."""

    arrival_s: float
    adapter: str | None
    task: str
    application: str
    payload: dict[str, Any]
    expected_output_tokens: int
    slo_s: float
    stream: int | None = None  # video analytics: the camera it came from
    meta: dict[str, Any] = field(default_factory=dict)


def popularity(n_adapters: int, skew: float, alpha: float = 1.0) -> np.ndarray:
    """Request shares of ``n_adapters`` adapters: the first gets ``skew``, the others
    split ``1 - skew`` by a power law (rank ``i`` >= 2 gets weight ``i ** -alpha``).

    ``skew`` must keep the first adapter the most requested one (with two adapters it must
    be >= 0.5); with one adapter it gets every request and ``skew`` is not used."""
    if n_adapters < 1:
        raise ValueError(f"need at least one adapter, got {n_adapters}")
    if not 0.0 < skew <= 1.0:
        raise ValueError(f"skew is the most requested adapter's share, in (0, 1]; got {skew}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    if n_adapters == 1:
        return np.ones(1)
    weights = np.arange(2, n_adapters + 1, dtype=float) ** -alpha
    rest = (1.0 - skew) * weights / weights.sum()
    if rest[0] > skew + 1e-12:
        raise ValueError(
            f"skew {skew} leaves adapter 2 a larger share ({rest[0]:.3f}); raise skew or add adapters"
        )
    return np.concatenate([[skew], rest])


def poisson_arrivals(rng: np.random.Generator, rate: float, duration_s: float) -> np.ndarray:
    """Arrival times of a Poisson process of ``rate``/s in ``[0, duration_s)``."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError(f"rate and duration must be > 0, got {rate} and {duration_s}")
    times: list[float] = []
    t = rng.exponential(1.0 / rate)
    while t < duration_s:
        times.append(t)
        t += rng.exponential(1.0 / rate)
    return np.asarray(times)


def make_image(rng: np.random.Generator, size: int) -> np.ndarray:
    """A blocky random RGB picture (uint8, ``size`` x ``size`` x 3)."""
    cells = rng.integers(0, 256, size=(size // 14, size // 14, 3), dtype=np.uint8)
    return np.kron(cells, np.ones((14, 14, 1), dtype=np.uint8))


def png_data_uri(pixels: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG", compress_level=1)  # fast: hundreds per point
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def qwen2vl_text(messages: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """Render one user turn of :func:`build_messages` as Qwen2-VL chat text plus its images."""
    parts: list[str] = []
    images: list[str] = []
    for item in messages[0]["content"]:
        if item["type"] == "image_url":
            parts.append("<|vision_start|><|image_pad|><|vision_end|>")
            images.append(item["image_url"]["url"])
        else:
            parts.append(item["text"])
    text = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{''.join(parts)}<|im_end|>\n<|im_start|>assistant\n"
    )
    return text, images


def visual_retrieval(
    adapters: Sequence[str],
    rate: float,
    duration_s: float,
    skew: float = 0.6,
    seed: int = 0,
    alpha: float = 1.0,
    output_tokens: Mapping[str, int] | None = None,
    slo_s: float | None = None,
    max_requests: int | None = None,
    image_sizes: Sequence[int] = IMAGE_SIZES,
) -> list[Request]:
    """Poisson arrivals of single-image retrieval requests (tasks drawn uniformly, image
    sides drawn from ``image_sizes``). ``alpha`` 0 with ``skew`` 1/n is uniform popularity."""
    if not image_sizes or any(s < 28 or s % 28 for s in image_sizes):
        raise ValueError(f"image_sizes must be multiples of 28 px (Qwen2-VL's patch grid), got {image_sizes}")
    rng = np.random.default_rng(seed)
    shares = popularity(len(adapters), skew, alpha)
    lengths = _lengths(output_tokens)
    arrivals = poisson_arrivals(rng, rate, duration_s)[:max_requests]
    requests = []
    for t in arrivals:
        adapter = adapters[rng.choice(len(adapters), p=shares)]
        task = RETRIEVAL_TASKS[rng.integers(len(RETRIEVAL_TASKS))]
        fields = {
            "referring_expression": {"target": _TARGETS[rng.integers(len(_TARGETS))]},
            "vqa": {"question": _QUESTIONS[rng.integers(len(_QUESTIONS))]},
            "captioning": {},
        }[task]
        image = png_data_uri(make_image(rng, image_sizes[rng.integers(len(image_sizes))]))
        text, images = qwen2vl_text(build_messages(task, [image], **fields))
        requests.append(
            Request(
                arrival_s=float(t),
                adapter=adapter,
                task=task,
                application="visual_retrieval",
                payload=_payload(text, images, adapter, lengths[task]),
                expected_output_tokens=lengths[task],
                slo_s=SLO_S["visual_retrieval"] if slo_s is None else slo_s,
            )
        )
    return requests


def video_analytics(
    adapters: Sequence[str],
    streams: int,
    duration_s: float,
    seed: int = 0,
    head_adapters: Sequence[str] = (),
    detection_stride: int = 1,
    frame_size: int = FRAME_SIZE,
    output_tokens: Mapping[str, int] | None = None,
    slo_s: float | None = None,
    max_requests: int | None = None,
    chunk_period_s: float = 1.0,
) -> list[Request]:
    """``streams`` cameras, one 30-frame chunk every ``chunk_period_s`` seconds each, for
    ``duration_s`` seconds.

    Stream ``s`` starts at a random phase in its first period and uses adapter
    ``adapters[s % len(adapters)]``. All requests of a chunk arrive when the chunk does."""
    if streams < 1 or not adapters:
        raise ValueError("video analytics needs at least one stream and one adapter")
    if detection_stride < 1:
        raise ValueError(f"detection_stride must be >= 1, got {detection_stride}")
    if chunk_period_s <= 0:
        raise ValueError(f"chunk_period_s must be > 0, got {chunk_period_s}")
    unknown = sorted(set(head_adapters) - set(adapters))
    if unknown:
        raise ValueError(f"head adapters {unknown} are not among the workload's adapters")
    rng = np.random.default_rng(seed)
    lengths = _lengths(output_tokens)
    slo = SLO_S["video_analytics"] if slo_s is None else slo_s
    phases = rng.random(streams)
    sampled = np.linspace(0, FRAMES_PER_CHUNK - 1, UNDERSTANDING_FRAMES).round().astype(int)
    requests = []
    for s in range(streams):
        adapter = adapters[s % len(adapters)]
        scene = make_image(rng, frame_size)
        for chunk in range(math.ceil(duration_s / chunk_period_s - phases[s])):
            t = float((phases[s] + chunk) * chunk_period_s)
            # Frames of a chunk: the scene panning by one pixel per frame.
            frames = [np.roll(scene, chunk * FRAMES_PER_CHUNK + f, axis=1) for f in range(FRAMES_PER_CHUNK)]
            uris: dict[int, str] = {}

            def uri(f: int, frames: list[np.ndarray] = frames, uris: dict[int, str] = uris) -> str:
                if f not in uris:
                    uris[f] = png_data_uri(frames[f])
                return uris[f]

            for f in range(0, FRAMES_PER_CHUNK, detection_stride):
                category = _CATEGORIES[rng.integers(len(_CATEGORIES))]
                text, images = qwen2vl_text(build_messages("object_detection", [uri(f)], category=category))
                n = lengths["object_detection"]
                requests.append(
                    Request(t, adapter, "object_detection", "video_analytics",
                            _payload(text, images, adapter, n), n, slo, stream=s,
                            meta={"chunk": chunk, "frame": f})
                )
            text, images = qwen2vl_text(build_messages("video_understanding", [uri(int(f)) for f in sampled]))
            head = adapter in head_adapters
            n = 1 if head else lengths["video_understanding"]
            payload = _payload(text, images, adapter, n)
            if head:
                payload["sampling_params"] = {"custom_params": {"vlora_head": True}}
            requests.append(
                Request(t, adapter, "video_understanding", "video_analytics", payload, n, slo, stream=s,
                        meta={"chunk": chunk, "head": head})
            )
    requests.sort(key=lambda r: (r.arrival_s, r.stream))
    return requests[:max_requests]


@dataclass(frozen=True)
class TraceRow:
    arrival_s: float
    context_tokens: int
    generated_tokens: int


def read_trace(path: str | Path) -> list[TraceRow]:
    """Parse an Azure-format trace (see the module docstring), sorted by arrival."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing column(s) {sorted(missing)}")
        raw = []
        for line, row in enumerate(reader, start=2):
            try:
                stamp = _seconds(row["TIMESTAMP"])
                context, generated = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (TypeError, ValueError) as e:
                raise ValueError(f"{path}:{line}: bad row {row}: {e}") from None
            if context < 1 or generated < 1:
                raise ValueError(f"{path}:{line}: token counts must be >= 1, got {context}, {generated}")
            raw.append((stamp, context, generated))
    if not raw:
        raise ValueError(f"{path}: no requests")
    start = min(r[0] for r in raw)
    return sorted((TraceRow(s - start, c, g) for s, c, g in raw), key=lambda r: r.arrival_s)


def trace_replay(
    path: str | Path,
    adapters: Sequence[str],
    skew: float = 0.6,
    seed: int = 0,
    alpha: float = 1.0,
    rate: float | None = None,
    duration_s: float | None = None,
    max_context_tokens: int | None = None,
    max_output_tokens: int | None = None,
    token_ids: tuple[int, int] = (32, 256),
    slo_s: float | None = None,
    max_requests: int | None = None,
) -> list[Request]:
    """Replay a trace. ``rate`` rescales the timeline so the trace's mean rate becomes
    ``rate`` requests/s (the paper samples the Azure trace at set rates); ``duration_s``
    keeps the arrivals before it; the ``max_*`` caps clip token counts (small models)."""
    rows = read_trace(path)
    if rate is not None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        span = rows[-1].arrival_s
        scale = (len(rows) - 1) / (rate * span) if span > 0 else 0.0
        rows = [TraceRow(r.arrival_s * scale, r.context_tokens, r.generated_tokens) for r in rows]
    if duration_s is not None:
        rows = [r for r in rows if r.arrival_s < duration_s]
    rows = rows[:max_requests]
    rng = np.random.default_rng(seed)
    shares = popularity(len(adapters), skew, alpha)
    requests = []
    for r in rows:
        adapter = adapters[rng.choice(len(adapters), p=shares)]
        context = min(r.context_tokens, max_context_tokens or r.context_tokens)
        output = min(r.generated_tokens, max_output_tokens or r.generated_tokens)
        payload = {
            "input_ids": rng.integers(*token_ids, size=context).tolist(),
            "lora_path": adapter,
            "sampling_params": {"max_new_tokens": output, "temperature": 0, "ignore_eos": True},
        }
        requests.append(
            Request(r.arrival_s, adapter, "trace", "trace", payload, output,
                    SLO_S["trace"] if slo_s is None else slo_s)
        )
    return requests


def _seconds(stamp: str) -> float:
    stamp = stamp.strip()
    try:
        return float(stamp)
    except ValueError:
        pass
    head, dot, frac = stamp.partition(".")
    if dot:  # Python parses at most 6 fractional digits
        digits = "".join(c for c in frac if c.isdigit())
        stamp = f"{head}.{digits[:6]}{frac[len(digits):]}"
    return datetime.fromisoformat(stamp).timestamp()


def _lengths(overrides: Mapping[str, int] | None) -> dict[str, int]:
    lengths = dict(OUTPUT_TOKENS)
    for task, n in (overrides or {}).items():
        if task not in templates():
            raise ValueError(f"unknown task {task!r} in output_tokens")
        if n < 1:
            raise ValueError(f"output tokens of {task!r} must be >= 1, got {n}")
        lengths[task] = n
    return lengths


def _payload(text: str, images: list[str], adapter: str | None, max_new_tokens: int) -> dict[str, Any]:
    return {
        "text": text,
        "image_data": images[0] if len(images) == 1 else images,
        "lora_path": adapter,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
    }
