"""Per-task accuracy with the paper's metrics: top-1 accuracy for classification, F1 of
boxes (IoU >= 0.5) for detection, VQA-style normalised exact match for text."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

BOX = re.compile(r"<box>\s*\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)\s*,\s*\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)\s*</box>")
ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """VQA-style normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(ARTICLES.sub(" ", text).split())


def exact_match(predictions: Sequence[str], targets: Sequence[str]) -> float:
    """Share of predictions equal to their target after :func:`normalize_answer`."""
    _check(predictions, targets)
    return sum(
        normalize_answer(p) == normalize_answer(t) for p, t in zip(predictions, targets, strict=True)
    ) / len(targets)


def top1_accuracy(predictions: Sequence[str], targets: Sequence[str]) -> float:
    """Share of predicted labels equal to the target label (labels compared stripped)."""
    _check(predictions, targets)
    return sum(p.strip() == t.strip() for p, t in zip(predictions, targets, strict=True)) / len(targets)


def parse_boxes(text: str) -> list[tuple[int, int, int, int]]:
    """All ``<box>(x1,y1),(x2,y2)</box>`` boxes in ``text``; malformed ones are skipped."""
    return [tuple(int(v) for v in m.groups()) for m in BOX.finditer(text)]


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two ``(x1, y1, x2, y2)`` boxes."""
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(0.0, width) * max(0.0, height)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def box_f1(predictions: Sequence[str], targets: Sequence[str], threshold: float = 0.5) -> float:
    """Detection F1 over the whole split: a predicted box is a true positive when it matches a
    not yet matched target box of the same image with IoU >= ``threshold`` (greedy by IoU)."""
    _check(predictions, targets)
    tp = n_pred = n_true = 0
    for prediction, target in zip(predictions, targets, strict=True):
        pred_boxes, true_boxes = parse_boxes(prediction), parse_boxes(target)
        n_pred += len(pred_boxes)
        n_true += len(true_boxes)
        pairs = sorted(
            ((iou(p, t), i, j) for i, p in enumerate(pred_boxes) for j, t in enumerate(true_boxes)),
            reverse=True,
        )
        used_pred, used_true = set(), set()
        for overlap, i, j in pairs:
            if overlap >= threshold and i not in used_pred and j not in used_true:
                used_pred.add(i)
                used_true.add(j)
        tp += len(used_pred)
    if n_pred == 0 and n_true == 0:
        return 1.0
    return 2 * tp / (n_pred + n_true)


METRICS = {"classification": top1_accuracy, "detection": box_f1, "text": exact_match}


def score(task_type: str, predictions: Sequence[str], targets: Sequence[str]) -> float:
    """The task type's metric (see :data:`METRICS`)."""
    return METRICS[task_type](predictions, targets)


def _check(predictions: Sequence[str], targets: Sequence[str]) -> None:
    if len(predictions) != len(targets) or not targets:
        raise ValueError(
            f"need equally many predictions and targets, got {len(predictions)} and {len(targets)}"
        )
