"""A vision task head: one linear layer on the final hidden state of the prompt's last token.

The head answers a task whose outputs are a fixed label set (digit class, parity, a count,
a quadrant) in one forward pass, instead of decoding the label text (paper §4.2.2). It
imports torch only, so the trainer and the server share it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

TASK_TYPES = ("classification",)
POOLINGS = ("last",)


@dataclass(frozen=True)
class HeadSpec:
    """What a head answers. ``prompt`` is the default user prompt (the text after the image)."""

    task: str
    labels: tuple[str, ...]
    prompt: str
    task_type: str = "classification"
    pooling: str = "last"

    def __post_init__(self) -> None:
        if not self.task:
            raise ValueError("a head needs a task name")
        if len(self.labels) < 2:
            raise ValueError(f"head {self.task!r}: needs at least 2 labels, got {list(self.labels)}")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"head {self.task!r}: duplicate labels in {list(self.labels)}")
        if self.task_type not in TASK_TYPES:
            raise ValueError(f"head {self.task!r}: task_type must be one of {TASK_TYPES}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"head {self.task!r}: pooling must be one of {POOLINGS}")

    def to_json(self) -> dict:
        data = asdict(self)
        data["labels"] = list(self.labels)
        return data

    @classmethod
    def from_json(cls, data: dict) -> HeadSpec:
        return cls(
            task=data["task"],
            labels=tuple(data["labels"]),
            prompt=data["prompt"],
            task_type=data.get("task_type", "classification"),
            pooling=data.get("pooling", "last"),
        )


class TaskHead(nn.Module):
    """``logits = W h + b`` over ``spec.labels``, with ``h`` the last token's final hidden state
    (after the model's final norm: the vector the LM head reads)."""

    def __init__(self, spec: HeadSpec, hidden_size: int) -> None:
        super().__init__()
        self.spec = spec
        self.hidden_size = hidden_size
        self.linear = nn.Linear(hidden_size, len(spec.labels))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden``: ``[batch, hidden]`` (already pooled) or ``[batch, seq, hidden]`` with the
        prompt's last token at position -1 (left padding). Returns ``[batch, num_labels]`` logits."""
        if hidden.dim() == 3:
            hidden = hidden[:, -1]
        return self.linear(hidden.to(self.linear.weight.dtype))

    @torch.no_grad()
    def predict(self, hidden: torch.Tensor) -> list[str]:
        """The top-1 label of each row."""
        return [self.spec.labels[i] for i in self.forward(hidden).argmax(-1).tolist()]

    def check_shapes(self, state: dict[str, torch.Tensor]) -> None:
        """Raise ``ValueError`` unless ``state`` fits this head (weight ``[labels, hidden]``, bias ``[labels]``)."""
        want = {"weight": (len(self.spec.labels), self.hidden_size), "bias": (len(self.spec.labels),)}
        for key, shape in want.items():
            if key not in state:
                raise ValueError(f"head {self.spec.task!r}: missing tensor {key!r}")
            if tuple(state[key].shape) != shape:
                raise ValueError(
                    f"head {self.spec.task!r}: {key} has shape {tuple(state[key].shape)}, expected {shape} "
                    f"({len(self.spec.labels)} labels x hidden size {self.hidden_size})"
                )
