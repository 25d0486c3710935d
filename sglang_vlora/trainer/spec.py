"""The fusion spec (``tasks.yaml``): datasets, required accuracies, LoRA rank, steps, answer mode.

::

    seed: 0
    policy: random            # dataset order: random (the paper's) or spec
    lora: {rank: 8, alpha: 16}
    train: {steps: 60, batch_size: 16, lr: 0.01, head_lr: 0.003, replay: true}
    tasks:
      - name: digit-parity
        source: {builtin: digit-parity, n_train: 300, n_test: 100}
        answer: head          # head (task head) or lm (decoded answer text)
        required: 0.80        # accuracy on the task's val split (decisions; test is only reported)
        steps: 80             # optional, overrides train.steps for this dataset
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_vlora.trainer.learner import LoraSettings, TrainSettings


@dataclass(frozen=True)
class TaskSpec:
    name: str
    source: dict[str, Any]
    required: float
    answer: str = "lm"
    steps: int | None = None


@dataclass(frozen=True)
class FusionSpec:
    tasks: tuple[TaskSpec, ...]
    seed: int = 0
    policy: str = "random"
    lora: LoraSettings = LoraSettings()
    train: TrainSettings = TrainSettings()

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(names)})")
    if "targets" in data:
        data = {**data, "targets": tuple(data["targets"])}
    return cls(**data)


def parse_spec(data: dict[str, Any]) -> FusionSpec:
    """Validate a spec read from YAML/JSON; errors name the offending entry."""
    if not isinstance(data, dict) or not data.get("tasks"):
        raise ValueError("a fusion spec needs a non-empty 'tasks' list")
    tasks = []
    for index, entry in enumerate(data["tasks"]):
        where = f"tasks[{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: must be a mapping")
        entry = dict(entry)
        source = entry.get("source")
        if not isinstance(source, dict):
            raise ValueError(
                f"{where}: needs a 'source' mapping ({{builtin: NAME}} or {{callable: MODULE:FN}})"
            )
        entry.setdefault("name", source.get("builtin") or str(source.get("callable", "")).rpartition(":")[2])
        task = _build(TaskSpec, entry, where)
        if not 0.0 <= float(task.required) <= 1.0:
            raise ValueError(f"{where}: required must be in [0, 1], got {task.required}")
        if task.answer not in ("lm", "head"):
            raise ValueError(f"{where}: answer must be 'lm' or 'head', got {task.answer!r}")
        tasks.append(dataclasses.replace(task, required=float(task.required)))
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"task names must be unique: {names}")
    top = {k: v for k, v in data.items() if k not in ("tasks", "lora", "train")}
    known = {"seed", "policy"}
    if set(top) - known:
        raise ValueError(f"spec: unknown keys {sorted(set(top) - known)}")
    return FusionSpec(
        tasks=tuple(tasks),
        seed=int(top.get("seed", 0)),
        policy=str(top.get("policy", "random")),
        lora=_build(LoraSettings, dict(data.get("lora") or {}), "lora"),
        train=_build(TrainSettings, dict(data.get("train") or {}), "train"),
    )


def load_spec(path: Path | str) -> FusionSpec:
    """Read ``tasks.yaml`` (or JSON, which is YAML too)."""
    import yaml

    return parse_spec(yaml.safe_load(Path(path).read_text()))
