"""Accuracy-aware knowledge fusion (paper §4.2.1, Fig. 10): pack datasets into few adapters.

Greedy, in the order an :data:`ORDER_POLICIES` policy gives: train the current adapter with
the next dataset; evaluate every task of that adapter; if any falls below its requirement,
roll the adapter back to its weights before this dataset, close it, and start a new adapter
with the dataset. A dataset that misses its requirement even alone gets an adapter of its own
(flagged in the manifest) and the next dataset starts a new one.

Every decision reads the tasks' ``val`` split. When an adapter is closed (its weights final),
each of its tasks is measured once on its ``test`` split, which no decision has seen: the
manifest reports both, and only the test figure is an unbiased estimate of the accuracy.

This module is plain logic over the :class:`Learner` protocol (no torch): the real learner
is :class:`~sglang_vlora.trainer.learner.VLMLearner`, the tests use an accuracy oracle.
After every dataset a checkpoint (state + the open adapter) is written atomically, so an
interrupted run resumes where it stopped and ends exactly as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tqdm.auto import tqdm

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STATE_DIR = ".fusion"
MANIFEST_FORMAT = "vlora-fusion"
MANIFEST_VERSION = 2
SPLITS = ("val", "test")  # what Learner.evaluate reads: decisions, then the final report


@dataclass(frozen=True)
class FusionTask:
    """A dataset to fuse and the accuracy its task must keep (its metric, on its val split)."""

    name: str
    required: float


class Learner(Protocol):
    """What fusion needs from a trainer: one live adapter at a time."""

    def start_adapter(self, seed: int) -> None:
        """Make the live adapter a fresh one."""

    def train(self, tasks: Sequence[str], new_task: str, seed: int) -> None:
        """Train the live adapter, which now holds ``tasks``, on the newly added ``new_task``."""

    def evaluate(self, task: str, split: str) -> float:
        """The live adapter's accuracy on ``task``'s ``split`` (one of :data:`SPLITS`)."""

    def snapshot(self) -> Any:
        """A copy of the live adapter's weights."""

    def restore(self, snapshot: Any) -> None:
        """Put a :meth:`snapshot` back exactly."""

    def save_adapter(self, out_dir: Path, tasks: Sequence[str]) -> None:
        """Write the live adapter as a package serving ``tasks``."""

    def load_adapter(self, adapter_dir: Path, tasks: Sequence[str]) -> None:
        """Make a package written by :meth:`save_adapter` the live adapter."""


# ---------------------------------------------------------------- order policies

OrderPolicy = Callable[[Sequence[FusionTask], random.Random], list[str]]


def random_order(tasks: Sequence[FusionTask], rng: random.Random) -> list[str]:
    """The paper's policy: a random order (seeded)."""
    names = [t.name for t in tasks]
    rng.shuffle(names)
    return names


def spec_order(tasks: Sequence[FusionTask], rng: random.Random) -> list[str]:
    """The order the datasets are listed in."""
    return [t.name for t in tasks]


ORDER_POLICIES: dict[str, OrderPolicy] = {"random": random_order, "spec": spec_order}


def register_order_policy(name: str) -> Callable[[OrderPolicy], OrderPolicy]:
    """Decorator adding a policy to :data:`ORDER_POLICIES` (selectable by name in a spec)."""

    def wrap(policy: OrderPolicy) -> OrderPolicy:
        ORDER_POLICIES[name] = policy
        return policy

    return wrap


# ---------------------------------------------------------------- state


@dataclass
class AdapterRecord:
    """One adapter: its tasks, their val accuracies as last measured with all of them inside
    (what the decisions read) and, once the adapter is closed, their test accuracies."""

    name: str
    tasks: list[str] = field(default_factory=list)
    accuracy: dict[str, float] = field(default_factory=dict)
    test_accuracy: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class FusionState:
    fingerprint: str
    order: list[str]
    next_index: int = 0
    closed: list[AdapterRecord] = field(default_factory=list)
    current: AdapterRecord | None = None
    rejections: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FusionState:
        current = data.get("current")
        return cls(
            fingerprint=data["fingerprint"],
            order=list(data["order"]),
            next_index=int(data["next_index"]),
            closed=[AdapterRecord(**a) for a in data["closed"]],
            current=AdapterRecord(**current) if current else None,
            rejections=list(data["rejections"]),
        )


def derive_seed(seed: int, *parts: object) -> int:
    """A seed for one step, stable across processes (Python's ``hash`` is salted)."""
    digest = hashlib.sha256(json.dumps([seed, *map(str, parts)]).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def fingerprint(obj: Any) -> str:
    """A short hash of a JSON-able description of a run (spec, settings, base model)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- fusion


@dataclass
class FusionResult:
    manifest: dict[str, Any]
    path: Path


class _Checkpoint:
    """``<out>/.fusion/ckpt/`` holds ``state.json`` and the open adapter. A new checkpoint is
    written beside it and swapped in by renames, so a crash leaves the old or the new one."""

    def __init__(self, out_dir: Path) -> None:
        self.root = out_dir / STATE_DIR
        self.path, self.tmp, self.old = self.root / "ckpt", self.root / "ckpt.tmp", self.root / "ckpt.old"

    def load(self) -> tuple[FusionState, Path] | None:
        for path in (self.path, self.old):
            if (path / "state.json").exists():
                return FusionState.from_json(json.loads((path / "state.json").read_text())), path / "adapter"
        return None

    def save(self, state: FusionState, learner: Learner) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        if state.current is not None:
            learner.save_adapter(self.tmp / "adapter", state.current.tasks)
        (self.tmp / "state.json").write_text(json.dumps(asdict(state), indent=2))
        shutil.rmtree(self.old, ignore_errors=True)
        if self.path.exists():
            self.path.rename(self.old)
        self.tmp.rename(self.path)
        shutil.rmtree(self.old, ignore_errors=True)

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def fuse(
    tasks: Sequence[FusionTask],
    learner: Learner,
    out_dir: Path | str,
    *,
    seed: int = 0,
    policy: str | OrderPolicy = "random",
    run_fingerprint: str = "",
    task_info: Mapping[str, Mapping[str, Any]] | None = None,
    progress: bool = True,
) -> FusionResult:
    """Pack ``tasks`` into adapters under ``out_dir`` and write ``out_dir/manifest.json``.

    Adapters are named ``<out_dir name>-<i>`` and saved in sub-folders of that name.
    ``run_fingerprint`` identifies the run: a checkpoint or output of another run is refused
    rather than mixed in, and a finished run's manifest is returned as it is. ``task_info`` adds
    entries (prompt, labels, answer mode...) to each task of the manifest. Resumes from
    ``out_dir/.fusion`` when a checkpoint is there.
    """
    out_dir = Path(out_dir)
    required = {t.name: t.required for t in tasks}
    if len(required) != len(tasks):
        raise ValueError("task names must be unique")
    checkpoint = _Checkpoint(out_dir)
    loaded = checkpoint.load()
    if loaded is None and (out_dir / MANIFEST).exists():
        return _finished_run(out_dir, run_fingerprint)
    if loaded is not None:
        state = _resumed_state(loaded, learner, checkpoint, run_fingerprint)
    else:
        state = _new_state(tasks, seed, policy, run_fingerprint)
    steps = _FusionSteps(state, learner, out_dir, required, seed)
    bar = tqdm(total=len(state.order), initial=state.next_index, desc="fusion", disable=not progress)
    while state.next_index < len(state.order):
        steps.add(state.order[state.next_index])
        state.next_index += 1
        checkpoint.save(state, learner)
        bar.update(1)
        bar.set_postfix(adapters=len(state.closed) + (state.current is not None))
    bar.close()
    if state.current is not None:
        steps.close()
    manifest = build_manifest(state, required, seed, policy, task_info or {})
    manifest["fingerprint"] = run_fingerprint
    path = out_dir / MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    checkpoint.clear()
    return FusionResult(manifest, path)


def _finished_run(out_dir: Path, run_fingerprint: str) -> FusionResult:
    """The manifest of a run that completed in ``out_dir``; refused if another run wrote it."""
    done = json.loads((out_dir / MANIFEST).read_text())
    if done.get("fingerprint") != run_fingerprint:
        raise ValueError(
            f"{out_dir} holds the output of another run; remove it (vlora-fuse --restart) or use a new output folder"
        )
    log.info("%s is complete: nothing to do", out_dir)
    return FusionResult(done, out_dir / MANIFEST)


def _resumed_state(
    loaded: tuple[FusionState, Path], learner: Learner, checkpoint: _Checkpoint, run_fingerprint: str
) -> FusionState:
    """The checkpoint's state, with its open adapter made the live one; refused if another
    run wrote it."""
    state, adapter_dir = loaded
    if state.fingerprint != run_fingerprint:
        raise ValueError(
            f"{checkpoint.root} holds a checkpoint of another run (spec, settings or base model differ); "
            "remove it (vlora-fuse --restart) or use a new output folder"
        )
    if state.current is not None:
        learner.load_adapter(adapter_dir, state.current.tasks)
    log.info("resuming at dataset %d of %d", state.next_index, len(state.order))
    return state


def _new_state(
    tasks: Sequence[FusionTask], seed: int, policy: str | OrderPolicy, run_fingerprint: str
) -> FusionState:
    """A fresh run: the datasets in the order the policy gives (checked to be a permutation)."""
    order_policy = ORDER_POLICIES[policy] if isinstance(policy, str) else policy
    order = order_policy(list(tasks), random.Random(derive_seed(seed, "order")))
    if sorted(order) != sorted(t.name for t in tasks):
        raise ValueError(f"order policy returned {order}, not a permutation of {sorted(t.name for t in tasks)}")
    return FusionState(fingerprint=run_fingerprint, order=order)


class _FusionSteps:
    """The greedy steps over a run's state: add a dataset to the open adapter or roll it back,
    open an adapter with a dataset, close an adapter (measuring its test split)."""

    def __init__(
        self, state: FusionState, learner: Learner, out_dir: Path, required: Mapping[str, float], seed: int
    ) -> None:
        self.state, self.learner, self.out_dir, self.required, self.seed = state, learner, out_dir, required, seed

    def add(self, task: str) -> None:
        """Train the open adapter with ``task`` and keep it if every task of it still meets its
        requirement on val; else roll back, close it and open a new adapter with ``task``."""
        current = self.state.current
        if current is None:
            self.open_with(task)
            return
        started = time.perf_counter()
        before = self.learner.snapshot()
        candidate = [*current.tasks, task]
        self.learner.train(candidate, task, derive_seed(self.seed, "train", len(self.state.closed), task))
        accuracy = {t: self.learner.evaluate(t, "val") for t in candidate}
        current.seconds += time.perf_counter() - started
        below = {t: a for t, a in accuracy.items() if a < self.required[t]}
        if below:
            self.learner.restore(before)
            self.state.rejections.append({"task": task, "adapter": current.name, "below": below})
            log.info("%s does not fit %s (below requirement: %s): rolled back", task, current.name, below)
            self.close()
            self.open_with(task)
        else:
            current.tasks, current.accuracy = candidate, accuracy
            log.info("%s joins %s: %s", task, current.name, {t: round(a, 3) for t, a in accuracy.items()})

    def open_with(self, task: str) -> None:
        """A new adapter trained on ``task`` alone; closed at once if it misses its requirement."""
        index = len(self.state.closed)
        record = AdapterRecord(name=f"{self.out_dir.name}-{index}", tasks=[task])
        started = time.perf_counter()
        self.learner.start_adapter(derive_seed(self.seed, "adapter", index))
        self.learner.train([task], task, derive_seed(self.seed, "train", index, task))
        record.accuracy = {task: self.learner.evaluate(task, "val")}
        record.seconds += time.perf_counter() - started
        self.state.current = record
        if record.accuracy[task] < self.required[task]:
            log.warning(
                "%s reaches %.3f alone, below its requirement %.3f: it keeps adapter %s to itself",
                task,
                record.accuracy[task],
                self.required[task],
                record.name,
            )
            self.close()

    def close(self) -> None:
        """Measure the open adapter's tasks on their test split once, save it, close it."""
        record = self.state.current
        started = time.perf_counter()
        record.test_accuracy = {t: self.learner.evaluate(t, "test") for t in record.tasks}
        record.seconds += time.perf_counter() - started
        self.learner.save_adapter(self.out_dir / record.name, record.tasks)
        self.state.closed.append(record)
        self.state.current = None


def build_manifest(
    state: FusionState,
    required: Mapping[str, float],
    seed: int,
    policy: str | OrderPolicy,
    task_info: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    adapters = []
    for record in state.closed:
        entries = []
        for task in record.tasks:
            val, test = record.accuracy[task], record.test_accuracy[task]
            entry = {
                "task": task,
                "required": required[task],
                "val_accuracy": round(val, 4),
                "test_accuracy": round(test, 4),
                "meets": val >= required[task],
                "test_meets": test >= required[task],
            }
            entries.append({**entry, **task_info.get(task, {})})
        adapters.append(
            {
                "name": record.name,
                "path": record.name,
                "tasks": entries,
                "train_seconds": round(record.seconds, 1),
            }
        )
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "seed": seed,
        "policy": policy if isinstance(policy, str) else getattr(policy, "__name__", "custom"),
        "order": state.order,
        "adapters": adapters,
        "rejections": state.rejections,
        "tasks_per_adapter": round(len(state.order) / max(1, len(adapters)), 2),
        "train_seconds": round(sum(r.seconds for r in state.closed), 1),
    }


def load_manifest(path: Path | str) -> dict[str, Any]:
    """Read a manifest (a file, or the folder holding ``manifest.json``); adapter paths come
    back absolute."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST
    manifest = json.loads(path.read_text())
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path} is not a {MANIFEST_FORMAT} manifest")
    for adapter in manifest["adapters"]:
        adapter["path"] = str((path.parent / adapter["path"]).resolve())
    return manifest


def lora_paths(manifest: Mapping[str, Any]) -> list[str]:
    """``NAME=PATH`` items for SGLang's ``--lora-paths`` (from a :func:`load_manifest` result)."""
    return [f"{a['name']}={a['path']}" for a in manifest["adapters"]]
