"""Broken adapter packages, each made from a real PEFT adapter of the tiny model by one edit,
with the words the refusal must contain. Shared by the server corpus (``/load_lora_adapter``)
and the offline check (``python -m sglang_vlora.adapters check``): both run one check."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from sglang_vlora.adapters import HEAD_CONFIG, HEAD_WEIGHTS, PEFT_CONFIG, save_heads
from sglang_vlora.heads.task_head import HeadSpec, TaskHead

WEIGHTS = "adapter_model.safetensors"
HIDDEN = 128


@dataclass(frozen=True)
class BadPackage:
    kind: str
    edit: Callable[[Path], None]
    reason: str


def _config(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        config = json.loads((root / PEFT_CONFIG).read_text())
        edit(config)
        (root / PEFT_CONFIG).write_text(json.dumps(config))

    return apply


def _tensors(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        tensors = load_file(str(root / WEIGHTS))
        edit(tensors)
        save_file(tensors, str(root / WEIGHTS))

    return apply


def _first(tensors: dict, part: str) -> str:
    return sorted(k for k in tensors if part in k)[0]


def _set(part: str, make: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Path], None]:
    def edit(tensors: dict) -> None:
        key = _first(tensors, part)
        tensors[key] = make(tensors[key])

    return _tensors(edit)


def _poison(value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def make(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t.view(-1)[3] = value
        return t

    return make


def _drop(part: str) -> Callable[[Path], None]:
    return _tensors(lambda tensors: tensors.pop(_first(tensors, part)))


def _rename_layer(tensors: dict) -> None:
    for key in [k for k in tensors if ".layers.1." in k]:
        tensors[key.replace(".layers.1.", ".layers.7.")] = tensors.pop(key)


def _only_non_lora(tensors: dict) -> None:
    tensors.clear()
    tensors["classifier.weight"] = torch.zeros(2, 2)


def _head(root: Path, hidden: int = HIDDEN, labels: tuple[str, ...] = ("yes", "no")) -> None:
    save_heads([TaskHead(HeadSpec("answer", labels, "Is it?"), hidden)], root)


def _head_config(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        _head(root)
        config = json.loads((root / HEAD_CONFIG).read_text())
        edit(config)
        (root / HEAD_CONFIG).write_text(json.dumps(config))

    return apply


def _head_tensor(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        _head(root)
        tensors = load_file(str(root / HEAD_WEIGHTS))
        edit(tensors)
        save_file(tensors, str(root / HEAD_WEIGHTS))

    return apply


def _head_nan(tensors: dict) -> None:
    tensors["answer.weight"] = tensors["answer.weight"].clone()
    tensors["answer.weight"][0, 0] = float("nan")


BAD_PACKAGES = [
    BadPackage("tensor-shape-misfit", _set("q_proj.lora_A", lambda t: torch.randn(t.shape[0], 50)), "does not fit the model's q_proj"),
    BadPackage("tensor-nan", _set("lora_B", _poison(float("nan"))), "NaN or infinite"),
    BadPackage("tensor-inf", _set("lora_A", _poison(float("inf"))), "NaN or infinite"),
    BadPackage("tensor-int-dtype", _set("lora_A", lambda t: t.to(torch.int32)), "not floating point"),
    BadPackage("tensor-3d", _set("lora_A", lambda t: t.unsqueeze(0)), "must be 2-D"),
    BadPackage("tensor-rank-differs-from-config", _config(lambda c: c.update(r=4)), "says r=4"),
    BadPackage("tensor-without-partner", _drop("lora_B"), "without its partner"),
    BadPackage("tensor-layer-out-of-range", _tensors(_rename_layer), "the model has 2 layers"),
    BadPackage("tensors-none-lora", _tensors(_only_non_lora), "hold no LoRA tensor"),
    BadPackage("weights-corrupt", lambda root: (root / WEIGHTS).write_bytes(b"not a safetensors file"), "cannot be read"),
    BadPackage("weights-missing", lambda root: (root / WEIGHTS).unlink(), "the LoRA weights are missing"),
    BadPackage("config-missing", lambda root: (root / PEFT_CONFIG).unlink(), f"no {PEFT_CONFIG}"),
    BadPackage("config-not-json", lambda root: (root / PEFT_CONFIG).write_text("{oops"), "not readable JSON"),
    BadPackage("config-rank-zero", _config(lambda c: c.update(r=0)), "must be an integer >= 1, got 0"),
    BadPackage("config-rank-text", _config(lambda c: c.update(r="eight")), "must be an integer >= 1"),
    BadPackage("config-rank-above-max", _config(lambda c: c.update(r=64)), "above the server's --max-lora-rank 32"),
    BadPackage("config-alpha-text", _config(lambda c: c.update(lora_alpha="x")), "lora_alpha must be a finite number"),
    BadPackage("config-unknown-module", _config(lambda c: c.update(target_modules=["q_proj", "foo_proj"])), "['foo_proj'] are not served"),
    BadPackage("config-no-modules", _config(lambda c: c.update(target_modules=[])), "target_modules must be a non-empty list"),
    BadPackage("config-rank-pattern", _config(lambda c: c.update(rank_pattern={"q_proj": 4})), "rank_pattern"),
    BadPackage("config-dora", _config(lambda c: c.update(use_dora=True)), "DoRA"),
    BadPackage("config-not-lora", _config(lambda c: c.update(peft_type="IA3")), "only LORA adapters"),
    BadPackage("head-no-labels", _head_config(lambda c: c["heads"][0].pop("labels")), "has no 'labels'"),
    BadPackage("head-wrong-format", _head_config(lambda c: c.update(format="other")), '"format": "vlora-head"'),
    BadPackage("head-one-label", _head_config(lambda c: c["heads"][0].update(labels=["yes"])), "at least 2 labels"),
    BadPackage("head-duplicate-labels", _head_config(lambda c: c["heads"][0].update(labels=["a", "a"])), "duplicate labels"),
    BadPackage("head-task-name", _head_config(lambda c: c["heads"][0].update(task="../x")), ".task must be"),
    BadPackage("head-no-heads", _head_config(lambda c: c.update(heads=[])), "heads must be a non-empty list"),
    BadPackage("head-hidden-size", lambda root: _head(root, hidden=64), "hidden size 64"),
    BadPackage("head-weights-missing", lambda root: (_head(root), (root / HEAD_WEIGHTS).unlink()), f"{HEAD_WEIGHTS} is missing"),
    BadPackage("head-tensor-missing", _head_tensor(lambda t: t.pop("answer.bias")), "no tensor 'answer.bias'"),
    BadPackage("head-tensor-nan", _head_tensor(_head_nan), "NaN or infinite"),
]


def build(bad: BadPackage, source: Path, out: Path) -> Path:
    """A copy of the package ``source`` under ``out/<kind>`` with the one edit."""
    root = out / bad.kind
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(source, root)
    bad.edit(root)
    return root
