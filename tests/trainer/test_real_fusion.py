"""One real fusion on CPU: the CLI trains the tiny Qwen2-VL on six datasets (five answered by
heads, one by decoded text), rolls back once, and its adapters, reloaded from disk, reproduce
the accuracies of the manifest."""

from __future__ import annotations

import base64
import io
import json
import time
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from PIL import Image

from sglang_vlora.trainer import cli
from sglang_vlora.trainer.fusion import load_manifest, lora_paths
from sglang_vlora.trainer.metrics import normalize_answer, score
from sglang_vlora.trainer.reference import reference_answers


def task(name: str, required: float, n_train: int = 160, answer: str = "head") -> dict:
    return {
        "name": name,
        "source": {"builtin": name, "n_train": n_train, "n_test": 60},
        "answer": answer,
        "required": required,
    }


# In the listed order: count and picture name share adapter 0; the seven's quadrant (never
# above 0.4 on this model) cannot keep 0.9: adding it to adapter 0 is rolled back, it gets
# adapter 1 alone and misses its requirement there; texture, digit class and parity answered
# as text share adapter 2. Six distinct datasets; requirements keep 0.1+ of margin to the val
# accuracies measured on a 2-core CPU (about 0.78, 0.38; 0.25; 0.37, 0.42 before parity joins
# and 0.7 after, 0.82).
SPEC = {
    "seed": 0,
    "policy": "spec",
    "lora": {"rank": 8, "alpha": 16},
    "train": {"steps": 40, "batch_size": 16, "lr": 0.003, "head_lr": 0.01},
    "tasks": [
        task("digit-count", 0.65),
        task("picture-name", 0.25),
        task("seven-quadrant", 0.9, n_train=100),
        task("texture", 0.25),
        task("digit-class", 0.3),
        {**task("digit-parity", 0.65, answer="lm"), "steps": 120},
    ],
}


@pytest.fixture(scope="module")
def fused(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, float]:
    root = tmp_path_factory.mktemp("fusion")
    spec_path = root / "tasks.yaml"
    spec_path.write_text(yaml.safe_dump(SPEC))
    threads = torch.get_num_threads()
    started = time.perf_counter()
    status = cli.main(
        [
            "--spec",
            str(spec_path),
            "--base",
            str(tiny_model),
            "--out",
            str(root / "digits"),
            "--quiet",
            "--threads",
            "1",
        ]
    )
    seconds = time.perf_counter() - started
    torch.set_num_threads(threads)
    return root / "digits", status, seconds


def test_fusion_packs_rolls_back_and_flags_the_impossible_task(fused: tuple[Path, int, float]) -> None:
    out, status, seconds = fused
    manifest = load_manifest(out)
    packed = [[t["task"] for t in a["tasks"]] for a in manifest["adapters"]]
    assert packed == [
        ["digit-count", "picture-name"],
        ["seven-quadrant"],
        ["texture", "digit-class", "digit-parity"],
    ]
    assert [r["task"] for r in manifest["rejections"]] == ["seven-quadrant"]
    assert "seven-quadrant" in manifest["rejections"][0]["below"]
    met = {t["task"]: t["meets"] for a in manifest["adapters"] for t in a["tasks"]}
    assert [task for task, ok in met.items() if not ok] == ["seven-quadrant"]
    assert status == 2  # a task missed its requirement
    assert [p.split("=")[0] for p in lora_paths(manifest)] == ["digits-0", "digits-1", "digits-2"]
    assert not (out / ".fusion").exists()
    print(cli.summary(json.loads((out / "manifest.json").read_text())), f"\nwall {seconds:.0f} s")


@pytest.fixture(scope="module")
def trainer_answers(fused: tuple[Path, int, float], tiny_model: Path):
    return reference_answers(fused[0], tiny_model)


def test_saved_adapters_reproduce_the_manifest_accuracies(trainer_answers) -> None:
    """Adapter 0 was saved after a rolled-back attempt: if rollback had left any trace of the
    seven-quadrant training in it, its reloaded accuracies would not match those measured
    before that attempt."""
    answers = trainer_answers
    assert [(a.adapter, a.task) for a in answers] == [
        ("digits-0", "digit-count"),
        ("digits-0", "picture-name"),
        ("digits-1", "seven-quadrant"),
        ("digits-2", "texture"),
        ("digits-2", "digit-class"),
        ("digits-2", "digit-parity"),
    ]
    for answer in answers:
        assert round(answer.accuracy, 4) == answer.manifest_accuracy, answer.task
        assert len(answer.images) == len(answer.predictions) == 60
        assert answer.prompt_text.endswith("<|im_start|>assistant\n")


# The server runs SGLang's CPU kernels, the trainer HF's: near-tied answers may flip.
MIN_AGREEMENT = 0.95
MAX_ACCURACY_GAP = 0.05


def server_answer(server, answer, image) -> str:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    params = {"max_new_tokens": 8, "temperature": 0}
    if answer.answer == "head":
        params["custom_params"] = {"vlora_head": answer.task}
    body = httpx.post(
        server.url + "/generate",
        json={
            "text": answer.prompt_text,
            "image_data": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode(),
            "lora_path": answer.adapter,
            "sampling_params": params,
        },
        timeout=120,
    ).json()
    if answer.answer == "head":
        return body["meta_info"]["vlora_head"][0]["label"]
    return body["text"].strip()


def test_server_serves_the_fused_adapters_like_the_trainer(fused, trainer_answers, server) -> None:
    """The fused adapters load into the running SGLang server and answer the test splits
    (heads through one forward, text by decoding) as the trainer's own evaluation does."""
    out, _, _ = fused
    for entry in load_manifest(out)["adapters"]:
        response = httpx.post(
            server.url + "/load_lora_adapter",
            json={"lora_name": entry["name"], "lora_path": entry["path"]},
            timeout=120,
        )
        assert response.status_code == 200, response.text
    for answer in trainer_answers:
        served = [server_answer(server, answer, image) for image in answer.images]
        agree = sum(normalize_answer(a) == normalize_answer(b) for a, b in zip(served, answer.predictions, strict=True))
        assert agree / len(served) >= MIN_AGREEMENT, (answer.task, agree, len(served))
        served_accuracy = score(answer.task_type, served, answer.targets)
        assert abs(served_accuracy - answer.accuracy) <= MAX_ACCURACY_GAP, answer.task
