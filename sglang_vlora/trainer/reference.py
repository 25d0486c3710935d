"""The trainer's own answers for a fusion output: what a server must reproduce.

For each adapter of a manifest, reload the package from disk, rebuild each task's test split
from its recorded source, and answer it with the trainer's model code. A server test sends the
same images with the task's ``prompt_text`` (or the head request) to the adapter of the same
name and compares answer by answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sglang_vlora.trainer.data import build_task
from sglang_vlora.trainer.fusion import load_manifest
from sglang_vlora.trainer.learner import TaskPlan, TrainSettings, VLMLearner
from sglang_vlora.trainer.metrics import score


@dataclass
class TaskAnswers:
    adapter: str
    adapter_path: str
    task: str
    answer: str
    task_type: str
    prompt_text: str
    images: list[np.ndarray]
    targets: list[str]
    predictions: list[str]
    accuracy: float
    manifest_accuracy: float


def reference_answers(
    manifest_dir: Path | str, base: Path | str, eval_batch_size: int = 64
) -> list[TaskAnswers]:
    """Re-answer every task of every adapter of a fusion output (test splits) with the trainer.

    ``accuracy`` equals the manifest's ``test_accuracy`` when the same model and batch size are used.
    """
    manifest = load_manifest(manifest_dir)
    plans = {}
    for adapter in manifest["adapters"]:
        for entry in adapter["tasks"]:
            data = build_task(entry["source"], name=entry["task"])
            plans[entry["task"]] = TaskPlan(data=data, answer=entry["answer"])
    learner = VLMLearner(base, plans, train=TrainSettings(eval_batch_size=eval_batch_size), progress=False)
    results = []
    for adapter in manifest["adapters"]:
        learner.load_adapter(Path(adapter["path"]), [t["task"] for t in adapter["tasks"]])
        for entry in adapter["tasks"]:
            data = plans[entry["task"]].data
            predictions = learner.predict(entry["task"])
            targets = [e.target for e in data.test]
            results.append(
                TaskAnswers(
                    adapter=adapter["name"],
                    adapter_path=adapter["path"],
                    task=entry["task"],
                    answer=entry["answer"],
                    task_type=data.task_type,
                    prompt_text=entry["prompt_text"],
                    images=[e.image for e in data.test],
                    targets=targets,
                    predictions=predictions,
                    accuracy=score(data.task_type, predictions, targets),
                    manifest_accuracy=entry["test_accuracy"],
                )
            )
    return results
