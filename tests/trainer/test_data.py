"""Datasets from packaged images, data collection with a small model, metrics, spec parsing."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from sglang_vlora.trainer import collect, data, metrics
from sglang_vlora.trainer.spec import parse_spec


@pytest.mark.parametrize("name", sorted(data.BUILTIN_TASKS))
def test_builtin_tasks_are_deterministic_with_disjoint_held_out_splits(name: str) -> None:
    build = data.BUILTIN_TASKS[name]
    one, two = build(n_train=40, n_test=20, seed=3), build(n_train=40, n_test=20, seed=3)
    assert [e.target for e in one.train] == [e.target for e in two.train]
    assert len(one.val) == len(one.test) == 20
    for split in ("val", "test"):
        assert all(np.array_equal(a.image, b.image) for a, b in zip(getattr(one, split), getattr(two, split), strict=True))
    # the held-out splits do not depend on the size of the train split
    bigger = build(n_train=60, n_test=20, seed=3)
    assert all(np.array_equal(a.image, b.image) for a, b in zip(one.test, bigger.test, strict=True))
    assert all(np.array_equal(a.image, b.image) for a, b in zip(one.val, bigger.val, strict=True))
    for example in one.train + one.val + one.test:
        assert example.image.dtype == np.uint8 and example.image.shape[2] == 3
        assert 56 <= example.image.shape[0] <= 112 and 56 <= example.image.shape[1] <= 112
    train_images = {e.image.tobytes() for e in one.train}
    val_images = {e.image.tobytes() for e in one.val}
    assert not any(e.image.tobytes() in train_images | val_images for e in one.test)
    assert not val_images & train_images
    if one.labels:
        assert len(set(e.target for e in one.train)) > 1


def test_digit_scans_splits_are_disjoint_and_cover_all_digits() -> None:
    splits = {name: data.digit_scans(name) for name in data.SCAN_SPLITS}
    assert sum(len(scans) for scans, _ in splits.values()) == 1797
    for _, digits in splits.values():
        assert set(digits.tolist()) == set(range(10))
    seen: set[bytes] = set()
    for scans, _ in splits.values():
        keys = {s.tobytes() for s in scans}
        assert not keys & seen
        seen |= keys


def test_scene_tasks_answer_what_is_drawn() -> None:
    count = data.digit_count(n_train=30, n_test=10)
    for example in count.train:
        cells = [example.image[r * 56 : (r + 1) * 56, c * 56 : (c + 1) * 56] for r in (0, 1) for c in (0, 1)]
        inked = sum(bool((cell < 128).any()) for cell in cells)
        assert data.NUMBER_WORDS[inked] == example.target
    box = data.seven_box(n_train=10, n_test=5)
    for example in box.train:
        x1, y1, x2, y2 = metrics.parse_boxes(example.target)[0]
        ys, xs = np.nonzero(example.image.min(axis=2) < 128)
        edges = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
        assert [round(1000 * int(v) / 112) for v in edges] == [x1, y1, x2, y2]


def test_collected_labels_come_from_the_small_model() -> None:
    task = collect.collected_digits(n_images=120, seed=1)
    assert (len(task.train), len(task.val), len(task.test)) == (72, 24, 24)
    assert task.labels == data.NUMBER_WORDS
    # the labeller is a real classifier: it mostly agrees with the true digits it never saw
    truth = data._single_digit_examples(
        "unlabeled", 120, np.random.default_rng([1, 2]), 56, data.NUMBER_WORDS.__getitem__
    )
    labels = collect.digit_small_model(seed=1)([e.image for e in truth])
    agreement = np.mean([a == e.target for a, e in zip(labels, truth, strict=True)])
    assert agreement > 0.85
    assert Counter(e.target for e in task.train + task.val + task.test) == Counter(labels)


def test_label_images_rejects_answers_outside_the_label_set() -> None:
    images = [np.zeros((56, 56, 3), np.uint8)] * 8
    with pytest.raises(ValueError, match="not in labels"):
        collect.label_images(
            images, lambda ims: ["yes"] * len(ims), name="t", prompt="?", labels=("no", "maybe")
        )
    with pytest.raises(ValueError, match="answers for"):
        collect.label_images(images, lambda ims: ["no"], name="t", prompt="?", labels=("no", "maybe"))


def test_metrics() -> None:
    assert metrics.exact_match(["The Cat.", "a dog"], ["cat", "two dogs"]) == 0.5
    assert metrics.top1_accuracy(["odd", "even "], ["odd", "odd"]) == 0.5
    target = "<ref>the seven</ref><box>(100,100),(300,300)</box>"
    assert metrics.box_f1([target], [target]) == 1.0
    assert metrics.box_f1(["<box>(110,100),(300,310)</box>"], [target]) == 1.0
    assert metrics.box_f1(["<box>(300,300),(500,500)</box>"], [target]) == 0.0
    assert metrics.box_f1(["no box at all", target], [target, target]) == pytest.approx(2 / 3)
    assert metrics.parse_boxes("<box>(1,2),(3</box>") == []
    with pytest.raises(ValueError):
        metrics.top1_accuracy(["a"], [])


def test_spec_errors_name_the_entry() -> None:
    good = {"tasks": [{"source": {"builtin": "digit-parity"}, "required": 0.8, "answer": "head"}]}
    spec = parse_spec(good)
    assert spec.tasks[0].name == "digit-parity" and spec.policy == "random"
    with pytest.raises(ValueError, match=r"tasks\[0\]: unknown keys \['requierd'\]"):
        parse_spec({"tasks": [{"source": {"builtin": "x"}, "requierd": 0.8}]})
    with pytest.raises(ValueError, match="answer must be"):
        parse_spec({"tasks": [{"source": {"builtin": "x"}, "required": 0.8, "answer": "both"}]})
    with pytest.raises(ValueError, match=r"lora: unknown keys"):
        parse_spec({**good, "lora": {"rnak": 4}})
    with pytest.raises(ValueError, match="unique"):
        parse_spec({"tasks": good["tasks"] * 2})


def test_trainer_imports_no_sglang() -> None:
    code = (
        "import sys\n"
        "import sglang_vlora.trainer.cli, sglang_vlora.trainer.learner, sglang_vlora.trainer.collect\n"
        "import sglang_vlora.adapters\n"
        "bad = sorted(m for m in sys.modules if m == 'sglang' or m.startswith('sglang.') or m == 'sgl_kernel')\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
