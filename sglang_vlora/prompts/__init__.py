"""Prompt templates of the five vision tasks (paper Appendix C, Fig. 25).

Visual retrieval: referring expression, VQA, captioning. Video analytics: object
detection (one frame) and video understanding (six sampled frames). Templates are files
users edit: one TOML file per task in the repository's top-level ``prompts/`` folder, shipped
in the wheel as ``sglang_vlora/prompts/templates/`` (in the repository a symlink to
``prompts/``). ``SGLANG_VLORA_PROMPTS_DIR`` points at a folder of one's own with the same
files. :func:`build_messages` turns a template into OpenAI-style chat messages with the images
first, as Qwen2-VL's chat template expects.
"""

from __future__ import annotations

import os
import string
import tomllib
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

TASKS = ("referring_expression", "vqa", "captioning", "object_detection", "video_understanding")
APPLICATIONS = ("visual_retrieval", "video_analytics")
PROMPTS_DIR_ENV = "SGLANG_VLORA_PROMPTS_DIR"
_KEYS = {"application": str, "images": int, "instruction": str, "answer_format": str}


class PromptTemplateError(ValueError):
    """A template folder or file that cannot be used; the message names the file."""


def templates_dir() -> Path:
    """The folder the templates are read from: ``$SGLANG_VLORA_PROMPTS_DIR`` or the packaged one."""
    override = os.environ.get(PROMPTS_DIR_ENV)
    if override:
        return Path(override)
    return Path(str(resources.files(__package__).joinpath("templates")))


@cache
def _load(folder: Path) -> dict[str, dict[str, Any]]:
    if not folder.is_dir():
        raise PromptTemplateError(f"prompt template folder {folder} does not exist (set by {PROMPTS_DIR_ENV}?)")
    present = {p.stem: p for p in folder.glob("*.toml")}
    unknown = sorted(set(present) - set(TASKS))
    if unknown:
        raise PromptTemplateError(
            f"{folder}: {[present[t].name for t in unknown]} name no task; files are <task>.toml for {list(TASKS)}"
        )
    missing = [t for t in TASKS if t not in present]
    if missing:
        raise PromptTemplateError(f"{folder}: missing template(s) {[f'{t}.toml' for t in missing]}")
    return {task: _parse(present[task]) for task in TASKS}


def _parse(path: Path) -> dict[str, Any]:
    """Read and check one template file; every problem is reported with the file's path."""
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PromptTemplateError(f"{path}: not valid TOML: {exc}") from None
    if set(spec) != set(_KEYS):
        raise PromptTemplateError(
            f"{path}: keys must be {sorted(_KEYS)}; missing {sorted(set(_KEYS) - set(spec))}, "
            f"unknown {sorted(set(spec) - set(_KEYS))}"
        )
    for key, kind in _KEYS.items():
        if type(spec[key]) is not kind:
            raise PromptTemplateError(f"{path}: {key} must be a {kind.__name__}, got {spec[key]!r}")
    if spec["application"] not in APPLICATIONS:
        raise PromptTemplateError(f"{path}: application must be one of {list(APPLICATIONS)}")
    if spec["images"] < 1:
        raise PromptTemplateError(f"{path}: images must be at least 1, got {spec['images']}")
    if not spec["instruction"].strip():
        raise PromptTemplateError(f"{path}: instruction is empty")
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(spec["instruction"]) if name is not None]
    except ValueError as exc:
        raise PromptTemplateError(f"{path}: instruction does not parse ({exc}); write a literal brace as {{{{ }}}}") from None
    bad = [name for name in names if not name.isidentifier()]
    if bad:
        raise PromptTemplateError(f"{path}: instruction fields must be names like {{question}}, got {bad}")
    return spec


def templates() -> dict[str, dict[str, Any]]:
    """Every task's template, read and checked once per folder."""
    return _load(templates_dir().resolve())


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
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known: {list(TASKS)}")
    return templates()[task]
