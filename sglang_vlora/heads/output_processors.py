"""Turn model text into structured results for the five vision tasks.

Boxes come as ``<ref>label</ref><box>(x1,y1),(x2,y2)</box>`` on a 0-1000 grid and
are mapped to pixels of the given image. Malformed text never raises: the result holds
what parsed plus ``malformed=True`` and the reasons, so a server can always answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

GRID = 1000.0
_REF = re.compile(r"<ref>(.*?)</ref>", re.S)
_BOX = re.compile(r"<box>\s*\(\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*\)\s*,\s*\(\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*\)\s*</box>", re.S)
_ANY_BOX = re.compile(r"<box>(.*?)</box>", re.S)


@dataclass(frozen=True)
class Box:
    """A box in pixels of the image it was asked about."""

    label: str
    x1: float
    y1: float
    x2: float
    y2: float


@dataclass
class TaskResult:
    task: str
    text: str
    boxes: list[Box] = field(default_factory=list)
    label: str | None = None
    malformed: bool = False
    problems: list[str] = field(default_factory=list)


def parse_boxes(task: str, text: str, image_size: tuple[int, int]) -> TaskResult:
    """Referring expression / object detection: every ``<box>`` after a ``<ref>``
    belongs to that ref's label. ``image_size`` is (width, height) in pixels."""
    result = TaskResult(task=task, text=text)
    width, height = image_size
    if width <= 0 or height <= 0:
        result.malformed = True
        result.problems.append(f"image size {image_size} is not positive")
        return result
    label = ""
    position = 0
    tokens = sorted(
        [(m.start(), "ref", m) for m in _REF.finditer(text)] + [(m.start(), "box", m) for m in _ANY_BOX.finditer(text)],
        key=lambda item: item[0],
    )
    for start, kind, match in tokens:
        if start < position:
            continue
        position = match.end()
        if kind == "ref":
            label = match.group(1).strip()
            continue
        coords = _BOX.fullmatch(match.group(0))
        if coords is None:
            result.malformed = True
            result.problems.append(f"unreadable box {match.group(0)!r}")
            continue
        x1, y1, x2, y2 = (float(v) for v in coords.groups())
        if not all(0 <= v <= GRID for v in (x1, y1, x2, y2)):
            result.malformed = True
            result.problems.append(f"box {match.group(0)!r} leaves the 0-{GRID:g} grid")
            x1, y1, x2, y2 = (min(max(v, 0.0), GRID) for v in (x1, y1, x2, y2))
        if x2 < x1 or y2 < y1:
            result.malformed = True
            result.problems.append(f"box {match.group(0)!r} has its corners swapped")
            x1, x2 = sorted((x1, x2))
            y1, y2 = sorted((y1, y2))
        result.boxes.append(
            Box(label, x1 / GRID * width, y1 / GRID * height, x2 / GRID * width, y2 / GRID * height)
        )
    if "<box>" in text and not result.boxes and not result.problems:
        result.malformed = True
        result.problems.append("an unterminated <box>")
    if not result.boxes and not result.malformed:
        result.malformed = True
        result.problems.append("no box in the answer")
    return result


def parse_text(task: str, text: str) -> TaskResult:
    """VQA and captioning: the answer text, stripped of special tokens and spaces."""
    cleaned = re.sub(r"<\|[^|>]*\|>", "", text).strip()
    result = TaskResult(task=task, text=text, label=cleaned or None)
    if not cleaned:
        result.malformed = True
        result.problems.append("empty answer")
    return result


def parse_action(task: str, text: str, labels: list[str]) -> TaskResult:
    """Video understanding: the first known action label the answer names
    (case-insensitive); without a known label, the answer text with ``malformed``."""
    result = TaskResult(task=task, text=text)
    lowered = text.lower()
    hits = [(lowered.find(label.lower()), label) for label in labels if label and label.lower() in lowered]
    if hits:
        result.label = min(hits)[1]
        return result
    result.label = text.strip() or None
    result.malformed = True
    result.problems.append("the answer names none of the known actions" if labels else "no action labels given")
    return result


def process(
    task: str,
    text: str,
    image_size: tuple[int, int] | None = None,
    labels: list[str] | None = None,
) -> TaskResult:
    """Dispatch by task name; never raises."""
    try:
        if task in ("referring_expression", "object_detection"):
            if image_size is None:
                return TaskResult(task, text, malformed=True, problems=["image_size is needed for boxes"])
            return parse_boxes(task, text, image_size)
        if task in ("vqa", "captioning"):
            return parse_text(task, text)
        if task == "video_understanding":
            return parse_action(task, text, labels or [])
        return TaskResult(task, text, malformed=True, problems=[f"unknown task {task!r}"])
    except Exception as exc:  # a bug here must not take a request down
        return TaskResult(task, text, malformed=True, problems=[f"output processor error: {exc!r}"])
