"""Prompt templates of the five vision tasks (paper Appendix C, Fig. 25).

Visual retrieval: referring expression, VQA, captioning. Video analytics: object
detection (one frame) and video understanding (six sampled frames). Templates are data
(``templates.json``); :func:`build_messages` turns one into OpenAI-style chat messages
with the images first, as Qwen2-VL's chat template expects.
"""

from __future__ import annotations

import json
import string
from functools import cache
from importlib import resources
from typing import Any

TASKS = ("referring_expression", "vqa", "captioning", "object_detection", "video_understanding")


@cache
def templates() -> dict[str, dict[str, Any]]:
    text = resources.files(__package__).joinpath("templates.json").read_text(encoding="utf-8")
    return json.loads(text)


def template_fields(task: str) -> list[str]:
    """The ``{field}`` names a task's instruction needs."""
    instruction = _template(task)["instruction"]
    return [name for _, name, _, _ in string.Formatter().parse(instruction) if name]


def instruction(task: str, **fields: str) -> str:
    """The task's instruction text with its fields filled in."""
    spec = _template(task)
    missing = sorted(set(template_fields(task)) - set(fields))
    if missing:
        raise ValueError(f"task {task!r} needs {missing}")
    return spec["instruction"].format(**fields)


def build_messages(task: str, image_urls: list[str], **fields: str) -> list[dict[str, Any]]:
    """One user turn: the task's images (URLs or ``data:`` URIs), then its instruction."""
    expected = _template(task)["images"]
    if len(image_urls) != expected:
        raise ValueError(f"task {task!r} takes {expected} image(s), got {len(image_urls)}")
    content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in image_urls]
    content.append({"type": "text", "text": instruction(task, **fields)})
    return [{"role": "user", "content": content}]


def _template(task: str) -> dict[str, Any]:
    try:
        return templates()[task]
    except KeyError:
        raise ValueError(f"unknown task {task!r}; known: {list(TASKS)}") from None
