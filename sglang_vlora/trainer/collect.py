"""Data collection (paper Fig. 9): label unlabeled images with an existing small model.

Any Python callable that maps a list of RGB images to answers is a labeller: a scikit-learn
classifier behind a feature function, a detector, a rule. The labelled images become a
:class:`~sglang_vlora.trainer.data.TaskData` that fusion packs like any other dataset; its
"ground truth" is the small model's output, so the fused adapter learns the small model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image

from sglang_vlora.trainer.data import NUMBER_WORDS, Example, TaskData, _single_digit_examples, digit_scans

Labeller = Callable[[Sequence[np.ndarray]], Sequence[str]]


def label_images(
    images: Sequence[np.ndarray],
    labeller: Labeller,
    *,
    name: str,
    prompt: str,
    labels: Sequence[str] = (),
    task_type: str = "classification",
    val_fraction: float = 0.2,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> TaskData:
    """Run ``labeller`` over ``images`` and split the result at random into train, val (read by
    fusion's accept / rollback) and test (only reported).

    With ``labels`` given, an answer outside the set raises ``ValueError`` (a labeller bug
    should not silently become training data).
    """
    answers = [str(a) for a in labeller(list(images))]
    if len(answers) != len(images):
        raise ValueError(f"labeller returned {len(answers)} answers for {len(images)} images")
    order = np.random.default_rng(seed).permutation(len(images))
    n_test = max(1, int(round(test_fraction * len(images))))
    n_val = max(1, int(round(val_fraction * len(images))))
    examples = [Example(images[i], answers[i]) for i in order]
    test, val, train = examples[:n_test], examples[n_test : n_test + n_val], examples[n_test + n_val :]
    return TaskData(name, prompt, task_type, train, val, test, tuple(labels))


def digit_features(images: Sequence[np.ndarray]) -> np.ndarray:
    """The small model's input: crop each image to its ink, shrink to 8x8, scale to 0..16 like
    scikit-learn's digits. Returns ``[n, 64]``."""
    rows = []
    for image in images:
        ink = 255.0 - np.asarray(image, dtype=np.float32).mean(axis=2)
        ys, xs = np.nonzero(ink > 32)
        if len(ys):
            ink = ink[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
        side = max(ink.shape)
        square = np.zeros((side, side), np.float32)
        top, left = (side - ink.shape[0]) // 2, (side - ink.shape[1]) // 2
        square[top : top + ink.shape[0], left : left + ink.shape[1]] = ink
        small = np.asarray(Image.fromarray(square).resize((8, 8), Image.BILINEAR), dtype=np.float32)
        rows.append(small.reshape(-1) * (16.0 / max(float(small.max()), 1.0)))
    return np.stack(rows)


def digit_small_model(seed: int = 0) -> Labeller:
    """A scikit-learn support-vector digit classifier trained on the raw 8x8 training scans,
    wrapped as a labeller of rendered digit images (answers are
    number words)."""
    from sklearn.svm import SVC

    scans, digits = digit_scans("train")
    model = SVC(random_state=seed).fit(scans.reshape(len(scans), -1), digits)

    def labeller(images: Sequence[np.ndarray]) -> list[str]:
        return [NUMBER_WORDS[int(d)] for d in model.predict(digit_features(images))]

    return labeller


def collected_digits(
    n_images: int = 400, seed: int = 0, size: int = 56, val_fraction: float = 0.2, test_fraction: float = 0.2
) -> TaskData:
    """Digit class learned from the small model: renderings of the unlabeled pool of scans
    (no other task's split holds them), labelled by :func:`digit_small_model` (usable as ``{"callable":
    "sglang_vlora.trainer.collect:collected_digits"}`` in a spec)."""
    rng = np.random.default_rng([seed, 2])
    images = [e.image for e in _single_digit_examples("unlabeled", n_images, rng, size, str)]
    return label_images(
        images,
        digit_small_model(seed),
        name="digit-class-collected",
        prompt="Which digit is this?",
        labels=NUMBER_WORDS,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        seed=seed,
    )
