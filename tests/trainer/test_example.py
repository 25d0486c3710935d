"""The README's worked fusion example (examples/fusion/tasks.yaml) runs end to end on the tiny
Qwen2-VL with short settings (fewer examples and steps): its datasets are distinct, every task
lands in exactly one adapter, and each is reported on its val split (which drove the
decisions) and on its test split (which did not)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

from sglang_vlora.trainer import cli
from sglang_vlora.trainer.data import build_task
from sglang_vlora.trainer.fusion import load_manifest
from sglang_vlora.trainer.spec import parse_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fusion" / "tasks.yaml"


def short(spec: dict) -> dict:
    """The example with 8 steps per dataset and 48 / 24 / 24 examples per split."""
    spec = json.loads(json.dumps(spec))
    spec["train"]["steps"] = 8
    for task in spec["tasks"]:
        task.pop("steps", None)
        source = task["source"]
        if "builtin" in source:
            source.update(n_train=48, n_test=24)
        else:
            source.update(n_images=96)
    return spec


def test_the_example_fuses_distinct_datasets(tiny_model: Path, tmp_path: Path) -> None:
    full = yaml.safe_load(EXAMPLE.read_text())
    parse_spec(full)
    spec = short(full)
    tasks = {t["name"]: build_task(t["source"], seed=spec["seed"], name=t["name"]) for t in spec["tasks"]}
    sources = [json.dumps({k: v for k, v in t["source"].items() if k in ("builtin", "callable")}) for t in spec["tasks"]]
    assert len(set(sources)) == len(sources), "two tasks of the example draw from the same dataset"
    examples = {tuple((e.image.tobytes(), e.target) for e in task.train) for task in tasks.values()}
    assert len(examples) == len(tasks), "two tasks of the example have the same examples"
    images = {name: {e.image.tobytes() for e in t.train + t.val + t.test} for name, t in tasks.items()}
    for name, task in tasks.items():
        for other, other_task in tasks.items():
            if name < other and images[name] & images[other]:
                # the same pictures only under another question (digit-class and digit-parity)
                assert task.prompt != other_task.prompt and set(task.labels) != set(other_task.labels), (name, other)

    path = tmp_path / "tasks.yaml"
    path.write_text(yaml.safe_dump(spec))
    threads = torch.get_num_threads()
    try:
        status = cli.main(["--spec", str(path), "--base", str(tiny_model), "--out", str(tmp_path / "digits"),
                           "--quiet", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    assert status in (0, 2)
    manifest = load_manifest(tmp_path / "digits")
    entries = [t for a in manifest["adapters"] for t in a["tasks"]]
    assert sorted(t["task"] for t in entries) == sorted(tasks)
    for entry in entries:
        assert 0.0 <= entry["val_accuracy"] <= 1.0 and 0.0 <= entry["test_accuracy"] <= 1.0
        assert entry["meets"] == (entry["val_accuracy"] >= entry["required"])
        assert entry["n_val"] == len(tasks[entry["task"]].val) and entry["n_test"] == len(tasks[entry["task"]].test)
        assert entry["answer"] == next(t["answer"] for t in spec["tasks"] if t["name"] == entry["task"])
    assert status == (0 if all(t["meets"] for t in entries) else 2)
    print(cli.summary(manifest))

