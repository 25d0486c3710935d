"""The V-LoRA adapter package: a PEFT LoRA adapter directory plus optional task heads.

Layout of one package directory::

    adapter_config.json          PEFT (written by ``peft``; SGLang loads it with --lora-paths)
    adapter_model.safetensors    PEFT LoRA weights
    vlora_head.json              optional: the heads (format below)
    vlora_head.safetensors       optional: tensors ``<task>.weight`` [labels, hidden], ``<task>.bias`` [labels]

``vlora_head.json``::

    {"format": "vlora-head", "version": 1, "hidden_size": 128,
     "heads": [{"task": "digit-parity", "task_type": "classification",
                "labels": ["even", "odd"], "pooling": "last",
                "prompt": "Is the digit even or odd?"}]}

An adapter that fuses several tasks carries one head per task that answers through a head.
SGLang drops non-LoRA tensors from adapter files, so heads live in their own files beside
the PEFT ones and are loaded with :func:`load_heads`. Imports torch and safetensors only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from sglang_vlora.heads.task_head import HeadSpec, TaskHead

HEAD_CONFIG = "vlora_head.json"
HEAD_WEIGHTS = "vlora_head.safetensors"
HEAD_FORMAT = "vlora-head"
HEAD_VERSION = 1


def save_heads(heads: Iterable[TaskHead], adapter_dir: Path | str) -> None:
    """Write ``vlora_head.json`` + ``vlora_head.safetensors`` for ``heads`` into ``adapter_dir``.

    Writes nothing when ``heads`` is empty (an adapter without heads is a plain PEFT dir).
    """
    heads = list(heads)
    if not heads:
        return
    hidden = {h.hidden_size for h in heads}
    if len(hidden) != 1:
        raise ValueError(f"heads of one adapter must share the hidden size, got {sorted(hidden)}")
    tasks = [h.spec.task for h in heads]
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"duplicate head tasks: {tasks}")
    adapter_dir = Path(adapter_dir)
    adapter_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for head in heads:
        tensors[f"{head.spec.task}.weight"] = (
            head.linear.weight.detach().to(torch.float32).contiguous().clone()
        )
        tensors[f"{head.spec.task}.bias"] = head.linear.bias.detach().to(torch.float32).contiguous().clone()
    save_file(tensors, str(adapter_dir / HEAD_WEIGHTS))
    config = {
        "format": HEAD_FORMAT,
        "version": HEAD_VERSION,
        "hidden_size": hidden.pop(),
        "heads": [h.spec.to_json() for h in heads],
    }
    (adapter_dir / HEAD_CONFIG).write_text(json.dumps(config, indent=2) + "\n")


def read_head_config(adapter_dir: Path | str) -> dict[str, Any] | None:
    """The parsed ``vlora_head.json`` of a package, or ``None`` when it has no heads."""
    path = Path(adapter_dir) / HEAD_CONFIG
    if not path.exists():
        return None
    config = json.loads(path.read_text())
    if config.get("format") != HEAD_FORMAT or config.get("version") != HEAD_VERSION:
        raise ValueError(f"{path}: not a {HEAD_FORMAT} v{HEAD_VERSION} file")
    return config


def load_heads(adapter_dir: Path | str, hidden_size: int) -> dict[str, TaskHead]:
    """Load every head of a package, keyed by task name; ``{}`` when it has none.

    ``hidden_size`` is the model's (text) hidden size; a head of another width, or tensors
    that do not fit the label count, raise ``ValueError`` naming the head and both shapes.
    """
    config = read_head_config(adapter_dir)
    if config is None:
        return {}
    if int(config["hidden_size"]) != hidden_size:
        raise ValueError(
            f"{adapter_dir}: heads were trained for hidden size {config['hidden_size']}, "
            f"the model has hidden size {hidden_size}"
        )
    tensors = load_file(str(Path(adapter_dir) / HEAD_WEIGHTS))
    heads = {}
    for entry in config["heads"]:
        spec = HeadSpec.from_json(entry)
        head = TaskHead(spec, hidden_size)
        state = {k: tensors.get(f"{spec.task}.{k}") for k in ("weight", "bias")}
        head.check_shapes({k: v for k, v in state.items() if v is not None})
        head.linear.load_state_dict(state)
        heads[spec.task] = head.eval()
    return heads


def load_head(adapter_dir: Path | str, hidden_size: int, task: str | None = None) -> TaskHead | None:
    """One head of a package: the one named ``task``, or the only one when ``task`` is None.

    Returns ``None`` when the package has no heads; raises ``KeyError`` for an unknown task and
    ``ValueError`` when ``task`` is None but the package has several heads.
    """
    heads = load_heads(adapter_dir, hidden_size)
    if not heads:
        return None
    if task is None:
        if len(heads) > 1:
            raise ValueError(f"{adapter_dir} has heads {sorted(heads)}: name the task")
        return next(iter(heads.values()))
    if task not in heads:
        raise KeyError(f"{adapter_dir} has no head for task {task!r} (heads: {sorted(heads)})")
    return heads[task]


def save_adapter_package(
    out_dir: Path | str, peft_model: Any = None, heads: Iterable[TaskHead] = (), adapter_name: str = "default"
) -> Path:
    """Write a package: the PEFT adapter ``adapter_name`` of ``peft_model`` (a ``peft.PeftModel``;
    skipped when None) and the heads. Returns ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if peft_model is not None:
        peft_model.save_pretrained(str(out_dir), selected_adapters=[adapter_name])
        nested = out_dir / adapter_name
        if adapter_name != "default" and nested.is_dir():
            # peft nests non-default adapters in a sub-folder; a package is flat.
            for item in nested.iterdir():
                item.replace(out_dir / item.name)
            nested.rmdir()
    save_heads(heads, out_dir)
    return out_dir
