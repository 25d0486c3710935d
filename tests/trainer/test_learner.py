"""The real learner on the tiny Qwen2-VL: exact rollback, determinism, the adapter package."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_vlora.adapters import HEAD_CONFIG, HEAD_WEIGHTS, load_head, load_heads
from sglang_vlora.heads.task_head import HeadSpec, TaskHead
from sglang_vlora.trainer import data
from sglang_vlora.trainer.learner import TaskPlan, TrainSettings, VLMLearner

SETTINGS = TrainSettings(steps=4, batch_size=4, eval_batch_size=16)


def make_learner(model: Path) -> VLMLearner:
    plans = {
        "digit-parity": TaskPlan(data.digit_parity(n_train=16, n_test=8), answer="head"),
        "digit-class": TaskPlan(data.digit_class(n_train=16, n_test=8), answer="lm"),
    }
    return VLMLearner(model, plans, train=SETTINGS, progress=False)


@pytest.fixture(scope="module")
def learner(tiny_model: Path) -> VLMLearner:
    return make_learner(tiny_model)


def trained_state(learner: VLMLearner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.model.named_parameters()}


def test_rollback_restores_lora_and_heads_exactly(learner: VLMLearner) -> None:
    learner.start_adapter(seed=1)
    learner.train(["digit-parity"], "digit-parity", seed=2)
    before = trained_state(learner)
    head_before = {k: v.clone() for k, v in learner.heads["digit-parity"].state_dict().items()}
    snapshot = learner.snapshot()
    learner.train(["digit-parity", "digit-class"], "digit-class", seed=3)
    after = trained_state(learner)
    assert any(not torch.equal(before[n], after[n]) for n in before if "lora_" in n)
    assert all(torch.equal(before[n], after[n]) for n in before if "lora_" not in n)  # base weights frozen
    learner.restore(snapshot)
    restored = trained_state(learner)
    assert all(torch.equal(before[n], restored[n]) for n in before)
    assert set(learner.heads) == {"digit-parity"}
    for key, value in learner.heads["digit-parity"].state_dict().items():
        assert torch.equal(value, head_before[key])


def test_training_is_deterministic_given_seeds(tiny_model: Path, learner: VLMLearner) -> None:
    other = make_learner(tiny_model)
    states = []
    for run in (learner, other):
        run.start_adapter(seed=5)
        run.train(["digit-parity"], "digit-parity", seed=6)
        run.train(["digit-parity", "digit-class"], "digit-class", seed=7)
        states.append(run.snapshot())
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    learner.start_adapter(seed=8)
    assert not all(torch.equal(states[0][k], learner.snapshot()[k]) for k in states[0] if "lora_A" in k)


def test_package_loads_with_plain_peft_and_answers_like_the_learner(
    tiny_model: Path, learner: VLMLearner, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    learner.start_adapter(seed=1)
    learner.train(["digit-parity"], "digit-parity", seed=2)
    learner.train(["digit-parity", "digit-class"], "digit-class", seed=3)
    learner.save_adapter(tmp_path / "pkg", ["digit-parity", "digit-class"])
    assert {p.name for p in (tmp_path / "pkg").iterdir()} >= {
        "adapter_config.json",
        "adapter_model.safetensors",
        HEAD_CONFIG,
        HEAD_WEIGHTS,
    }
    config = json.loads((tmp_path / "pkg" / HEAD_CONFIG).read_text())
    assert [h["task"] for h in config["heads"]] == ["digit-parity"] and config["hidden_size"] == 128

    base = AutoModelForImageTextToText.from_pretrained(tiny_model, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, tmp_path / "pkg").eval()
    head = load_head(tmp_path / "pkg", hidden_size=128)
    items = learner.encoded("digit-parity", "test")
    with torch.no_grad():
        batch = learner._batch(items, with_targets=False)
        hidden = peft_model.get_base_model().model(**batch).last_hidden_state
    assert head.predict(hidden) == learner.predict("digit-parity")

    # a fresh learner that loads the package gives the same answers on both tasks
    fresh = make_learner(tiny_model)
    fresh.load_adapter(tmp_path / "pkg", ["digit-parity", "digit-class"])
    for task in ("digit-parity", "digit-class"):
        assert fresh.predict(task) == learner.predict(task)


def test_head_shapes_are_validated(tmp_path: Path) -> None:
    from sglang_vlora.adapters import save_heads

    head = TaskHead(HeadSpec("parity", ("even", "odd"), "Is the digit even or odd?"), hidden_size=128)
    save_heads([head], tmp_path)
    assert set(load_heads(tmp_path, 128)) == {"parity"}
    with pytest.raises(ValueError, match="hidden size 128, the model has hidden size 3584"):
        load_heads(tmp_path, 3584)
    tensors = load_file(str(tmp_path / HEAD_WEIGHTS))
    tensors["parity.weight"] = torch.zeros(3, 128)
    save_file(tensors, str(tmp_path / HEAD_WEIGHTS))
    with pytest.raises(ValueError, match=r"weight has shape \(3, 128\), expected \(2, 128\)"):
        load_heads(tmp_path, 128)
    with pytest.raises(ValueError, match="duplicate labels"):
        HeadSpec("x", ("a", "a"), "?")
    assert load_head(tmp_path / "missing", 128) is None
