"""LoRA (+ task head) training and per-task evaluation of a Qwen2-VL with transformers + peft.

One :class:`VLMLearner` holds the base model with ONE live LoRA adapter (the one fusion is
currently filling) and the heads of that adapter. Fusion drives it through the
:class:`~sglang_vlora.trainer.fusion.Learner` protocol: start a fresh adapter, train it on a
set of tasks, evaluate a task, snapshot / restore (rollback), save / load a package.

Training is plain supervised learning (paper §4.2.1): cross-entropy on the answer tokens for
tasks answered by the language model, cross-entropy of the head's logits for tasks answered
by a head (§4.2.2). Everything random is drawn from generators seeded by the caller, so a
run is reproducible and a resumed run continues exactly as the uninterrupted one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from tqdm.auto import tqdm

from sglang_vlora.adapters import load_heads, save_adapter_package
from sglang_vlora.heads.task_head import HeadSpec, TaskHead
from sglang_vlora.trainer.data import TaskData
from sglang_vlora.trainer.metrics import score

# Keep to the language model's projections: SGLang loads LoRA for these names.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ANSWERS = ("lm", "head")


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 8
    alpha: int = 16
    targets: tuple[str, ...] = DEFAULT_TARGETS


@dataclass(frozen=True)
class TrainSettings:
    """``steps`` optimizer steps per added dataset, each on one batch of the new task plus (with
    ``replay``) one batch of a task already in the adapter, round robin. The learning rate
    decays linearly to zero over the steps."""

    steps: int = 60
    batch_size: int = 16
    lr: float = 5e-3
    head_lr: float = 5e-2
    replay: bool = True
    eval_batch_size: int = 64

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError("steps, batch_size and eval_batch_size must be positive")


@dataclass(frozen=True)
class TaskPlan:
    """A dataset and how the fused adapter answers it: ``lm`` (the answer text is decoded)
    or ``head`` (a task head over ``data.labels``). ``steps`` overrides the default."""

    data: TaskData
    answer: str = "lm"
    steps: int | None = None

    def __post_init__(self) -> None:
        if self.answer not in ANSWERS:
            raise ValueError(f"task {self.data.name!r}: answer must be one of {ANSWERS}")
        if self.answer == "head" and (self.data.task_type != "classification" or not self.data.labels):
            raise ValueError(f"task {self.data.name!r}: a head needs a classification task with labels")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"task {self.data.name!r}: steps must be positive")


def render_prompt(processor, prompt: str) -> str:
    """The full chat text the model sees for one image and ``prompt`` (generation prompt
    included): what a server request must send to get the trainer's answers."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


@dataclass
class _Encoded:
    input_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor
    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    target_ids: torch.Tensor
    target: str


class VLMLearner:
    """Trains and evaluates one LoRA adapter (+ heads) at a time on a transformers Qwen2-VL."""

    def __init__(
        self,
        base: Path | str,
        tasks: Mapping[str, TaskPlan],
        lora: LoraSettings = LoraSettings(),
        train: TrainSettings = TrainSettings(),
        progress: bool = True,
    ) -> None:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.base = Path(base)
        self.tasks = dict(tasks)
        self.lora = lora
        self.settings = train
        self.progress = progress
        self.processor = AutoProcessor.from_pretrained(self.base)
        self.processor.tokenizer.padding_side = "left"
        self.tokenizer = self.processor.tokenizer
        self.eos_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.pad_id = self.tokenizer.pad_token_id
        model = AutoModelForImageTextToText.from_pretrained(self.base, dtype=torch.float32)
        config = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            target_modules=list(lora.targets),
            lora_dropout=0.0,
            bias="none",
        )
        self.model = get_peft_model(model, config)
        self.model.eval()
        self.hidden_size = int(model.config.get_text_config().hidden_size)
        self._lora = {n: p for n, p in self.model.named_parameters() if "lora_" in n}
        self.heads: dict[str, TaskHead] = {}
        self._cache: dict[tuple[str, str], list[_Encoded]] = {}

    # ------------------------------------------------------------ adapter state

    def start_adapter(self, seed: int) -> None:
        """A fresh adapter: LoRA A uniform(+-1/sqrt(in)) as peft's default init, B = 0, no heads."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in sorted(self._lora.items()):
                if "lora_A" in name:
                    bound = 1.0 / math.sqrt(param.shape[1])
                    param.copy_((torch.rand(param.shape, generator=generator) * 2 - 1) * bound)
                else:
                    param.zero_()
        self.heads = {}

    def snapshot(self) -> dict[str, torch.Tensor]:
        """A copy of everything training changes: LoRA tensors and heads."""
        state = {f"lora/{n}": p.detach().clone() for n, p in self._lora.items()}
        for task, head in self.heads.items():
            state[f"head/{task}/weight"] = head.linear.weight.detach().clone()
            state[f"head/{task}/bias"] = head.linear.bias.detach().clone()
        return state

    def restore(self, state: Mapping[str, torch.Tensor]) -> None:
        """Put back a :meth:`snapshot` exactly (heads added since are dropped)."""
        with torch.no_grad():
            for name, param in self._lora.items():
                param.copy_(state[f"lora/{name}"])
        tasks = {key.split("/")[1] for key in state if key.startswith("head/")}
        self.heads = {}
        for task in sorted(tasks):
            head = self._new_head(task)
            with torch.no_grad():
                head.linear.weight.copy_(state[f"head/{task}/weight"])
                head.linear.bias.copy_(state[f"head/{task}/bias"])
            self.heads[task] = head

    def save_adapter(self, out_dir: Path | str, tasks: Sequence[str]) -> None:
        """Write the live adapter as a package (PEFT dir + heads of ``tasks`` that have one)."""
        heads = [self.heads[t] for t in tasks if t in self.heads]
        save_adapter_package(out_dir, self.model, heads)

    def load_adapter(self, adapter_dir: Path | str, tasks: Sequence[str]) -> None:
        """Make a saved package the live adapter again (used when resuming)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        state = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(self.model, state)
        missing = [k for k in result.missing_keys if "lora_" in k]
        if missing:
            raise ValueError(f"{adapter_dir}: adapter lacks {len(missing)} LoRA tensors, e.g. {missing[0]}")
        heads = load_heads(adapter_dir, self.hidden_size)
        self.heads = {t: heads[t] for t in tasks if t in heads}

    def _new_head(self, task: str) -> TaskHead:
        data = self.tasks[task].data
        head = TaskHead(HeadSpec(task=task, labels=data.labels, prompt=data.prompt), self.hidden_size)
        with torch.no_grad():
            head.linear.weight.zero_()
            head.linear.bias.zero_()
        return head

    # ------------------------------------------------------------ data

    def encoded(self, task: str, split: str) -> list[_Encoded]:
        """The task's split, tokenized and preprocessed once."""
        key = (task, split)
        if key not in self._cache:
            data = self.tasks[task].data
            examples = {"train": data.train, "val": data.val, "test": data.test}[split]
            text = render_prompt(self.processor, data.prompt)
            items = []
            for start in range(0, len(examples), 64):
                chunk = examples[start : start + 64]
                enc = self.processor(
                    text=[text] * len(chunk),
                    images=[Image.fromarray(e.image) for e in chunk],
                    return_tensors="pt",
                    padding=True,
                )
                rows = enc["image_grid_thw"].prod(-1).tolist()
                pixels = torch.split(enc["pixel_values"], rows)
                for i, example in enumerate(chunk):
                    keep = enc["attention_mask"][i].bool()
                    target = self.tokenizer(example.target + "<|im_end|>", add_special_tokens=False)[
                        "input_ids"
                    ]
                    items.append(
                        _Encoded(
                            input_ids=enc["input_ids"][i][keep],
                            mm_token_type_ids=enc["mm_token_type_ids"][i][keep],
                            pixel_values=pixels[i],
                            image_grid_thw=enc["image_grid_thw"][i : i + 1],
                            target_ids=torch.tensor(target, dtype=torch.long),
                            target=example.target,
                        )
                    )
            self._cache[key] = items
        return self._cache[key]

    def _batch(self, items: Sequence[_Encoded], with_targets: bool) -> dict[str, torch.Tensor]:
        """Left-padded batch (the prompt's last token, or the answer's last, sits at -1)."""
        seqs, types, labels = [], [], []
        for item in items:
            ids, tt = item.input_ids, item.mm_token_type_ids
            lab = torch.full_like(ids, -100)
            if with_targets:
                ids = torch.cat([ids, item.target_ids])
                tt = torch.cat([tt, torch.zeros_like(item.target_ids)])
                lab = torch.cat([lab, item.target_ids])
            seqs.append(ids)
            types.append(tt)
            labels.append(lab)
        length = max(len(s) for s in seqs)

        def pad(rows: list[torch.Tensor], value: int) -> torch.Tensor:
            return torch.stack(
                [torch.cat([torch.full((length - len(r),), value, dtype=r.dtype), r]) for r in rows]
            )

        batch = {
            "input_ids": pad(seqs, self.pad_id),
            "attention_mask": pad([torch.ones_like(s) for s in seqs], 0),
            "mm_token_type_ids": pad(types, 0),
            "pixel_values": torch.cat([i.pixel_values for i in items]),
            "image_grid_thw": torch.cat([i.image_grid_thw for i in items]),
        }
        if with_targets:
            batch["labels"] = pad(labels, -100)
        return batch

    # ------------------------------------------------------------ train / evaluate

    def _hidden(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        return self.model.get_base_model().model(**inputs).last_hidden_state

    def _loss(self, task: str, items: Sequence[_Encoded]) -> torch.Tensor:
        if self.tasks[task].answer == "head":
            hidden = self._hidden(self._batch(items, with_targets=False))
            labels = self.tasks[task].data.labels
            target = torch.tensor([labels.index(i.target) for i in items])
            return nn.functional.cross_entropy(self.heads[task](hidden), target)
        batch = self._batch(items, with_targets=True)
        hidden = self._hidden(batch)[:, :-1]
        labels = batch["labels"][:, 1:]
        keep = labels != -100
        logits = self.model.get_base_model().lm_head(hidden[keep])
        return nn.functional.cross_entropy(logits, labels[keep])

    def train(self, tasks: Sequence[str], new_task: str, seed: int) -> None:
        """Train the live adapter after adding ``new_task`` to ``tasks`` (which holds it)."""
        steps = self.tasks[new_task].steps or self.settings.steps
        others = [t for t in tasks if t != new_task] if self.settings.replay else []
        for task in [new_task, *others]:
            if self.tasks[task].answer == "head" and task not in self.heads:
                self.heads[task] = self._new_head(task)
        groups = [{"params": list(self._lora.values()), "lr": self.settings.lr}]
        head_params = [p for t in [new_task, *others] if t in self.heads for p in self.heads[t].parameters()]
        if head_params:
            groups.append({"params": head_params, "lr": self.settings.head_lr})
        optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)
        rng = np.random.default_rng(seed)
        self.model.train()
        bar = tqdm(range(steps), desc=f"train {new_task}", leave=False, disable=not self.progress)
        for step in bar:
            loss = self._loss(new_task, self._sample(new_task, rng))
            if others:
                replay = others[step % len(others)]
                loss = loss + self._loss(replay, self._sample(replay, rng))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            bar.set_postfix(loss=f"{loss.item():.3f}")
        self.model.eval()
        optimizer.zero_grad(set_to_none=True)

    def _sample(self, task: str, rng: np.random.Generator) -> list[_Encoded]:
        items = self.encoded(task, "train")
        picks = rng.choice(len(items), size=min(self.settings.batch_size, len(items)), replace=False)
        return [items[i] for i in picks]

    @torch.no_grad()
    def predict(self, task: str, split: str = "test") -> list[str]:
        """The adapter's answers on a split: head labels, or greedily decoded text."""
        items = self.encoded(task, split)
        plan = self.tasks[task]
        answers: list[str] = []
        size = self.settings.eval_batch_size
        max_new = max(len(i.target_ids) for i in self.encoded(task, "train") + items) + 2
        for start in range(0, len(items), size):
            chunk = items[start : start + size]
            batch = self._batch(chunk, with_targets=False)
            if plan.answer == "head":
                answers += self.heads[task].predict(self._hidden(batch))
                continue
            out = self.model.get_base_model().generate(
                **batch,
                max_new_tokens=max_new,
                do_sample=False,
                eos_token_id=self.eos_id,
                pad_token_id=self.pad_id,
            )
            new = out[:, batch["input_ids"].shape[1] :]
            answers += [t.strip() for t in self.tokenizer.batch_decode(new, skip_special_tokens=True)]
        return answers

    def evaluate(self, task: str, split: str) -> float:
        """The task's metric on a held-out split (``val`` or ``test``)."""
        data = self.tasks[task].data
        examples = {"val": data.val, "test": data.test}[split]
        return score(data.task_type, self.predict(task, split), [e.target for e in examples])
