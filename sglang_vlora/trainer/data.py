"""Task datasets built from real images that ship inside Python packages (no model hub).

* scikit-learn's digits: 1,797 real 8x8 scans of handwritten digits, upscaled and drawn
  onto small canvases, alone (digit class, parity) or several in one scene (how many
  digits, which quadrant holds the 7, where is the 7).
* scikit-image's bundled sample pictures: crops of photographs (which picture) and of
  textures (which texture).

Every task has three disjoint splits: ``train``; ``val``, which fusion's accept / rollback
decisions read; and ``test``, which only the final report reads (paper §4.2.1 evaluates on a
held-out split; keeping a third one makes the reported accuracy unbiased by those decisions).
Digit scans are split once by index (``i % 5``: 0 test, 1 val, 2 the unlabeled pool of data
collection, 3-4 train) so no task sees another split's scans; picture crops come from disjoint
regions of each picture (train: the left 60%; val and test: the top and bottom halves of the
right 40%). Images are 56x56 or 112x112 RGB
``uint8`` arrays: 4 or 16 visual tokens for the tiny Qwen2-VL.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
from PIL import Image

TASK_TYPES = ("classification", "text", "detection")
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
QUADRANTS = ("top left", "top right", "bottom left", "bottom right")


@dataclass(frozen=True)
class Example:
    """One image and the answer text the model should give for the task's prompt."""

    image: np.ndarray
    target: str


@dataclass
class TaskData:
    """A task: one prompt and three disjoint splits. ``val`` drives fusion's accept /
    rollback decisions; ``test`` is only reported.

    ``labels`` is the closed answer set of a classification task (needed for a head);
    ``source`` records how to rebuild the data (kept in the fusion manifest).
    """

    name: str
    prompt: str
    task_type: str
    train: list[Example]
    val: list[Example]
    test: list[Example]
    labels: tuple[str, ...] = ()
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task_type not in TASK_TYPES:
            raise ValueError(f"task {self.name!r}: task_type must be one of {TASK_TYPES}")
        if not self.train or not self.val or not self.test:
            raise ValueError(f"task {self.name!r}: needs non-empty train, val and test splits")
        if self.labels:
            unknown = {e.target for e in self.train + self.val + self.test} - set(self.labels)
            if unknown:
                raise ValueError(f"task {self.name!r}: targets {sorted(unknown)} are not in labels")


def to_rgb(image: np.ndarray) -> np.ndarray:
    """Any 2-D / RGB / RGBA / bool / float image -> ``uint8`` RGB."""
    image = np.asarray(image)
    if image.dtype == bool:
        image = image.astype(np.uint8) * 255
    elif image.dtype != np.uint8:
        image = np.clip(image * (255.0 if image.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3])


def resize(image: np.ndarray, size: int | tuple[int, int]) -> np.ndarray:
    """Bilinear resize to ``size`` (square side or ``(height, width)``)."""
    height, width = (size, size) if isinstance(size, int) else size
    return np.asarray(Image.fromarray(to_rgb(image)).resize((width, height), Image.BILINEAR))


# ---------------------------------------------------------------- digits


@cache
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images.astype(np.float32), digits.target.astype(np.int64)


SCAN_SPLITS = ("train", "val", "test", "unlabeled")


def digit_scans(split: str) -> tuple[np.ndarray, np.ndarray]:
    """The 8x8 scans (values 0..16) and their digits of one split. By ``i % 5``: 0 test, 1 val,
    2 ``unlabeled`` (the pool data collection labels with a small model, so collected tasks
    share no image with another task's splits), 3-4 train."""
    if split not in SCAN_SPLITS:
        raise ValueError(f"split must be one of {SCAN_SPLITS}, got {split!r}")
    images, targets = _digits()
    fifth = np.arange(len(images)) % 5
    keep = {"test": fifth == 0, "val": fifth == 1, "unlabeled": fifth == 2, "train": fifth >= 3}[split]
    return images[keep], targets[keep]


def draw_digit(scan: np.ndarray, size: int) -> np.ndarray:
    """An 8x8 scan as a ``size`` x ``size`` RGB glyph: dark ink on white paper."""
    ink = Image.fromarray((scan * (255.0 / 16.0)).astype(np.uint8)).resize((size, size), Image.BILINEAR)
    return to_rgb(255 - np.asarray(ink))


def _paste(canvas: np.ndarray, glyph: np.ndarray, top: int, left: int) -> None:
    height, width = glyph.shape[:2]
    region = canvas[top : top + height, left : left + width]
    np.minimum(region, glyph, out=region)


def _single_digit_examples(
    split: str, count: int, rng: np.random.Generator, size: int, answer: Callable[[int], str]
) -> list[Example]:
    scans, digits = digit_scans(split)
    return [
        Example(draw_digit(scans[i], size), answer(int(digits[i])))
        for i in rng.choice(len(scans), size=count, replace=count > len(scans))
    ]


def _splits(
    seed: int,
    n_train: int,
    n_test: int,
    n_val: int | None,
    make: Callable[[str, int, np.random.Generator], list[Example]],
) -> tuple[list[Example], list[Example], list[Example]]:
    """Train, val and test drawn from independent streams, so one split's size does not change
    another's examples. ``n_val`` defaults to ``n_test``."""
    train = make("train", n_train, np.random.default_rng([seed, 0]))
    val = make("val", n_test if n_val is None else n_val, np.random.default_rng([seed, 3]))
    test = make("test", n_test, np.random.default_rng([seed, 1]))
    return train, val, test


def digit_class(
    n_train: int = 300, n_test: int = 100, seed: int = 0, n_val: int | None = None, size: int = 56
) -> TaskData:
    """Which digit is this? (10 classes)."""
    train, val, test = _splits(
        seed, n_train, n_test, n_val, lambda s, n, r: _single_digit_examples(s, n, r, size, NUMBER_WORDS.__getitem__)
    )
    return TaskData("digit-class", "Which digit is this?", "classification", train, val, test, NUMBER_WORDS)


def digit_parity(
    n_train: int = 300, n_test: int = 100, seed: int = 0, n_val: int | None = None, size: int = 56
) -> TaskData:
    """Is the digit even or odd?"""
    labels = ("even", "odd")
    train, val, test = _splits(
        seed, n_train, n_test, n_val, lambda s, n, r: _single_digit_examples(s, n, r, size, lambda d: labels[d % 2])
    )
    return TaskData("digit-parity", "Is the digit even or odd?", "classification", train, val, test, labels)


def _scene(scans: np.ndarray, picks: list[int | None], size: int) -> np.ndarray:
    """A ``size`` x ``size`` scene of four cells; cell i holds scan ``picks[i]`` or stays empty.

    Digits fill their cell exactly: the tiny model's random vision tower does not see
    through shifted glyphs (a linear probe on its features drops from 67% to 26% on digit
    class when glyphs are shifted at random), and the point here is fusion, not vision."""
    cell = size // 2
    canvas = np.full((size, size, 3), 255, np.uint8)
    for quadrant, index in enumerate(picks):
        if index is not None:
            _paste(canvas, draw_digit(scans[index], cell), (quadrant // 2) * cell, (quadrant % 2) * cell)
    return canvas


def digit_count(
    n_train: int = 300, n_test: int = 100, seed: int = 0, n_val: int | None = None, size: int = 112
) -> TaskData:
    """How many digits are in the picture? (1-4 digits in a 2x2 scene)."""

    def make(split: str, count: int, rng: np.random.Generator) -> list[Example]:
        scans, _ = digit_scans(split)
        examples = []
        for _ in range(count):
            how_many = int(rng.integers(1, 5))
            cells = set(rng.choice(4, size=how_many, replace=False).tolist())
            picks = [int(rng.integers(len(scans))) if q in cells else None for q in range(4)]
            examples.append(Example(_scene(scans, picks, size), NUMBER_WORDS[how_many]))
        return examples

    train, val, test = _splits(seed, n_train, n_test, n_val, make)
    return TaskData(
        "digit-count", "How many digits are in the picture?", "classification", train, val, test, NUMBER_WORDS[1:5]
    )


def seven_quadrant(
    n_train: int = 300, n_test: int = 100, seed: int = 0, n_val: int | None = None, size: int = 112
) -> TaskData:
    """Which quadrant holds the 7? (four digits, exactly one of them a 7)."""

    def make(split: str, count: int, rng: np.random.Generator) -> list[Example]:
        scans, digits = digit_scans(split)
        sevens, others = np.flatnonzero(digits == 7), np.flatnonzero(digits != 7)
        examples = []
        for _ in range(count):
            quadrant = int(rng.integers(4))
            picks = [int(rng.choice(others)) for _ in range(4)]
            picks[quadrant] = int(rng.choice(sevens))
            examples.append(Example(_scene(scans, picks, size), QUADRANTS[quadrant]))
        return examples

    train, val, test = _splits(seed, n_train, n_test, n_val, make)
    return TaskData(
        "seven-quadrant", "Which quadrant holds the seven?", "classification", train, val, test, QUADRANTS
    )


def seven_box(
    n_train: int = 300, n_test: int = 100, seed: int = 0, n_val: int | None = None, size: int = 112
) -> TaskData:
    """Where is the 7? A detection task: answer ``<ref>the seven</ref><box>(x1,y1),(x2,y2)</box>``
    in Qwen2-VL's 0-1000 coordinates (paper App. C)."""

    def make(split: str, count: int, rng: np.random.Generator) -> list[Example]:
        scans, digits = digit_scans(split)
        sevens = np.flatnonzero(digits == 7)
        examples = []
        for _ in range(count):
            glyph = int(rng.integers(size // 4, size // 2 + 1))
            top, left = (int(v) for v in rng.integers(0, size - glyph + 1, size=2))
            canvas = np.full((size, size, 3), 255, np.uint8)
            drawn = draw_digit(scans[int(rng.choice(sevens))], glyph)
            _paste(canvas, drawn, top, left)
            ys, xs = np.nonzero(drawn.min(axis=2) < 128)  # the box bounds the ink, not the glyph square
            edges = (left + xs.min(), top + ys.min(), left + xs.max() + 1, top + ys.max() + 1)
            box = [round(1000 * int(v) / size) for v in edges]
            target = f"<ref>the seven</ref><box>({box[0]},{box[1]}),({box[2]},{box[3]})</box>"
            examples.append(Example(canvas, target))
        return examples

    train, val, test = _splits(seed, n_train, n_test, n_val, make)
    return TaskData("seven-box", "Find the seven and give its box.", "detection", train, val, test)


# ---------------------------------------------------------------- scikit-image pictures

PICTURES = {
    "astronaut": "astronaut",
    "cameraman": "camera",
    "coins": "coins",
    "coffee": "coffee",
    "cat": "chelsea",
    "rocket": "rocket",
}
TEXTURES = {"brick": "brick", "grass": "grass", "gravel": "gravel"}


@cache
def _skimage(name: str) -> np.ndarray:
    import skimage.data

    return to_rgb(getattr(skimage.data, name)())


def _crops(
    pictures: Mapping[str, str], split: str, count: int, rng: np.random.Generator, size: int, scale: float
) -> list[Example]:
    """Random square crops (side ``scale`` x the picture's short side) resized to ``size``;
    train crops lie in the left 60% of each picture, val and test crops in the top and bottom
    halves of the right 40%."""
    labels = sorted(pictures)
    examples = []
    for _ in range(count):
        label = labels[int(rng.integers(len(labels)))]
        picture = _skimage(pictures[label])
        height, width = picture.shape[:2]
        side = int(scale * min(height, width))
        lo, hi = (0, int(0.6 * width) - side) if split == "train" else (int(0.6 * width), width - side)
        rows = {"train": (0, height), "val": (0, height // 2), "test": (height // 2, height)}[split]
        if hi < lo or rows[1] - rows[0] < side:
            raise ValueError(f"picture {label!r} is too small for {split} crops of scale {scale}")
        left = int(rng.integers(lo, hi + 1))
        top = int(rng.integers(rows[0], rows[1] - side + 1))
        examples.append(Example(resize(picture[top : top + side, left : left + side], size), label))
    return examples


def picture_name(
    n_train: int = 300, n_test: int = 100, seed: int = 0, n_val: int | None = None, size: int = 56
) -> TaskData:
    """Which picture is this crop from? (six scikit-image sample photographs)."""
    train, val, test = _splits(seed, n_train, n_test, n_val, lambda s, n, r: _crops(PICTURES, s, n, r, size, 0.35))
    return TaskData(
        "picture-name",
        "Which picture is this part of?",
        "classification",
        train,
        val,
        test,
        tuple(sorted(PICTURES)),
    )


def texture(
    n_train: int = 300, n_test: int = 100, seed: int = 0, n_val: int | None = None, size: int = 56
) -> TaskData:
    """Which texture is this? (brick, grass, gravel)."""
    train, val, test = _splits(seed, n_train, n_test, n_val, lambda s, n, r: _crops(TEXTURES, s, n, r, size, 0.2))
    return TaskData(
        "texture", "Which texture is this?", "classification", train, val, test, tuple(sorted(TEXTURES))
    )


BUILTIN_TASKS: dict[str, Callable[..., TaskData]] = {
    "digit-class": digit_class,
    "digit-parity": digit_parity,
    "digit-count": digit_count,
    "seven-quadrant": seven_quadrant,
    "seven-box": seven_box,
    "picture-name": picture_name,
    "texture": texture,
}


def build_task(source: Mapping[str, Any], seed: int = 0, name: str | None = None) -> TaskData:
    """Build a task from a spec ``source``.

    ``{"builtin": "digit-parity", "n_train": 200}`` calls a builder of :data:`BUILTIN_TASKS`;
    ``{"callable": "package.module:function", ...}`` calls any importable function returning a
    :class:`TaskData` (for example one built with :func:`sglang_vlora.trainer.collect.label_images`).
    Other keys are keyword arguments; ``seed`` is passed unless the source sets it.
    """
    kwargs = {k: v for k, v in source.items() if k not in ("builtin", "callable")}
    kwargs.setdefault("seed", seed)
    if "builtin" in source:
        if source["builtin"] not in BUILTIN_TASKS:
            raise ValueError(f"unknown builtin task {source['builtin']!r}; known: {sorted(BUILTIN_TASKS)}")
        builder = BUILTIN_TASKS[source["builtin"]]
    elif "callable" in source:
        module, _, attr = str(source["callable"]).partition(":")
        builder = getattr(importlib.import_module(module), attr)
    else:
        raise ValueError(f"a task source needs 'builtin' or 'callable': {dict(source)}")
    task = builder(**kwargs)
    if not isinstance(task, TaskData):
        raise TypeError(f"{dict(source)} returned {type(task).__name__}, not TaskData")
    return dataclasses.replace(task, name=name or task.name, source=dict(source, seed=kwargs["seed"]))
