"""Fusion logic against an accuracy oracle: packing, rollback, determinism, resume, the held-out
test split (fast, no model)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from sglang_vlora.trainer.fusion import (
    MANIFEST,
    STATE_DIR,
    FusionTask,
    derive_seed,
    fuse,
    load_manifest,
    lora_paths,
    register_order_policy,
)

Oracle = Callable[[frozenset, str], float]


class Interrupted(Exception):
    pass


class OracleLearner:
    """A learner whose accuracies come from an oracle over the set of fused tasks, and whose
    'weights' are a vector that every training call perturbs with seeded noise."""

    def __init__(
        self, oracle: Oracle, interrupt_at: int | None = None, test_oracle: Oracle | None = None
    ) -> None:
        self.oracle = oracle
        self.test_oracle = test_oracle or oracle
        self.interrupt_at = interrupt_at
        self.evaluations: list[tuple[str, str, tuple[str, ...], list[float]]] = []
        self.tasks: tuple[str, ...] = ()
        self.weights = np.zeros(8)
        self.train_calls: list[tuple[tuple[str, ...], str]] = []
        self.accepted_weights: list[np.ndarray] = []

    def start_adapter(self, seed: int) -> None:
        self.tasks = ()
        self.weights = np.random.default_rng(seed).normal(size=8)

    def train(self, tasks: Sequence[str], new_task: str, seed: int) -> None:
        if self.interrupt_at is not None and len(self.train_calls) == self.interrupt_at:
            raise Interrupted
        self.train_calls.append((tuple(tasks), new_task))
        self.tasks = tuple(tasks)
        self.weights = self.weights + np.random.default_rng(seed).normal(size=8)

    def evaluate(self, task: str, split: str) -> float:
        assert task in self.tasks
        self.evaluations.append((split, task, self.tasks, self.weights.tolist()))
        return (self.oracle if split == "val" else self.test_oracle)(frozenset(self.tasks), task)

    def snapshot(self) -> tuple[tuple[str, ...], np.ndarray]:
        return self.tasks, self.weights.copy()

    def restore(self, snapshot: tuple[tuple[str, ...], np.ndarray]) -> None:
        self.tasks, weights = snapshot
        self.weights = weights.copy()

    def save_adapter(self, out_dir: Path, tasks: Sequence[str]) -> None:
        assert tuple(tasks) == self.tasks
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "adapter.json").write_text(
            json.dumps({"tasks": list(tasks), "weights": self.weights.tolist()})
        )

    def load_adapter(self, adapter_dir: Path, tasks: Sequence[str]) -> None:
        data = json.loads((adapter_dir / "adapter.json").read_text())
        assert data["tasks"] == list(tasks)
        self.tasks, self.weights = tuple(tasks), np.array(data["weights"])


def capacity_oracle(base: dict[str, float], load: dict[str, float], capacity: float = 1.0) -> Oracle:
    """Accuracy drops by 0.5 per unit of total load above the adapter's capacity."""

    def oracle(tasks: frozenset, task: str) -> float:
        excess = max(0.0, sum(load[t] for t in tasks) - capacity)
        return base[task] - 0.5 * excess

    return oracle


def adapters_of(manifest: dict) -> list[list[str]]:
    return [[t["task"] for t in a["tasks"]] for a in manifest["adapters"]]


def strip_times(manifest: dict) -> dict:
    manifest = json.loads(json.dumps(manifest))
    manifest.pop("train_seconds")
    for adapter in manifest["adapters"]:
        adapter.pop("train_seconds")
    return manifest


def test_packs_until_a_requirement_breaks_then_starts_a_new_adapter(tmp_path: Path) -> None:
    names = "abcdef"
    base = dict.fromkeys(names, 0.95)
    load = {"a": 0.4, "b": 0.4, "c": 0.4, "d": 0.3, "e": 0.3, "f": 0.5}
    tasks = [FusionTask(n, 0.9) for n in names]
    result = fuse(
        tasks, OracleLearner(capacity_oracle(base, load)), tmp_path / "fz", policy="spec", progress=False
    )
    # a+b = 0.8 fits; +c = 1.2 -> a,b,c drop to 0.85 < 0.9: roll back, new adapter. c+d+e = 1.0 fits; +f no.
    assert adapters_of(result.manifest) == [["a", "b"], ["c", "d", "e"], ["f"]]
    assert [r["task"] for r in result.manifest["rejections"]] == ["c", "f"]
    assert result.manifest["rejections"][0]["below"] == pytest.approx({"a": 0.85, "b": 0.85, "c": 0.85})
    assert result.manifest["tasks_per_adapter"] == 2.0
    for adapter in result.manifest["adapters"]:
        assert json.loads((tmp_path / "fz" / adapter["path"] / "adapter.json").read_text())["tasks"] == [
            t["task"] for t in adapter["tasks"]
        ]
    assert not (tmp_path / "fz" / STATE_DIR).exists()


def test_manifest_accuracies_are_the_measured_ones_and_meet_requirements(tmp_path: Path) -> None:
    rng = random.Random(7)
    for case in range(40):
        names = [f"t{i}" for i in range(rng.randint(1, 9))]
        base = {n: rng.uniform(0.7, 1.0) for n in names}
        load = {n: rng.uniform(0.05, 0.8) for n in names}
        required = {n: rng.uniform(0.6, 0.95) for n in names}
        oracle = capacity_oracle(base, load)
        tasks = [FusionTask(n, required[n]) for n in names]
        result = fuse(tasks, OracleLearner(oracle), tmp_path / f"case{case}", seed=case, progress=False)
        packed = adapters_of(result.manifest)
        assert sorted(t for a in packed for t in a) == sorted(names)  # every dataset exactly once
        assert [t for a in packed for t in a] == result.manifest["order"]  # greedy keeps the order
        for adapter in result.manifest["adapters"]:
            fused = frozenset(t["task"] for t in adapter["tasks"])
            for entry in adapter["tasks"]:
                assert entry["val_accuracy"] == pytest.approx(oracle(fused, entry["task"]), abs=1e-4)
                assert entry["test_accuracy"] == entry["val_accuracy"]  # the oracle gives both splits alike
                assert entry["meets"] == (oracle(fused, entry["task"]) >= required[entry["task"]])
            if len(fused) > 1:  # only a dataset that fails alone may miss its requirement
                assert all(e["meets"] for e in adapter["tasks"])
        # a dataset was rejected exactly where the next adapter starts
        starts = [a[0] for a in packed[1:]]
        assert [r["task"] for r in result.manifest["rejections"]] == [
            s
            for s, prev in zip(starts, packed[:-1], strict=True)
            if all(oracle(frozenset(prev), t) >= required[t] for t in prev)
        ]


def test_a_dataset_that_fails_alone_keeps_its_adapter_to_itself(tmp_path: Path) -> None:
    oracle = capacity_oracle({"a": 0.95, "bad": 0.5, "c": 0.95}, dict.fromkeys(["a", "bad", "c"], 0.1))
    tasks = [FusionTask("a", 0.9), FusionTask("bad", 0.9), FusionTask("c", 0.9)]
    learner = OracleLearner(oracle)
    result = fuse(tasks, learner, tmp_path / "fz", policy="spec", progress=False)
    assert adapters_of(result.manifest) == [["a"], ["bad"], ["c"]]
    assert [t["meets"] for a in result.manifest["adapters"] for t in a["tasks"]] == [True, False, True]
    # "c" was never tried inside the failing adapter
    assert (("bad", "c"), "c") not in learner.train_calls


def test_rollback_restores_the_weights_before_the_rejected_dataset(tmp_path: Path) -> None:
    load = {"a": 0.5, "b": 0.4, "c": 0.5}
    oracle = capacity_oracle(dict.fromkeys(load, 0.95), load)
    learner = OracleLearner(oracle)
    tasks = [FusionTask(n, 0.9) for n in load]
    fuse(tasks, learner, tmp_path / "fz", policy="spec", seed=3, progress=False)
    assert learner.train_calls == [(("a",), "a"), (("a", "b"), "b"), (("a", "b", "c"), "c"), (("c",), "c")]
    # adapter 0 as saved = fresh init + training on a + training on a,b: exactly, nothing of c
    expected = np.random.default_rng(derive_seed(3, "adapter", 0)).normal(size=8)
    expected = expected + np.random.default_rng(derive_seed(3, "train", 0, "a")).normal(size=8)
    expected = expected + np.random.default_rng(derive_seed(3, "train", 0, "b")).normal(size=8)
    saved = json.loads((tmp_path / "fz" / "fz-0" / "adapter.json").read_text())
    assert saved["tasks"] == ["a", "b"]
    assert np.array_equal(np.array(saved["weights"]), expected)


def _varied_problem() -> tuple[list[FusionTask], Oracle]:
    names = [f"d{i}" for i in range(8)]
    rng = random.Random(11)
    load = {n: rng.uniform(0.2, 0.6) for n in names}
    return [FusionTask(n, 0.9) for n in names], capacity_oracle(dict.fromkeys(names, 0.97), load)


def test_same_seed_same_result_and_seed_changes_random_order(tmp_path: Path) -> None:
    tasks, oracle = _varied_problem()
    runs = [
        fuse(tasks, OracleLearner(oracle), tmp_path / f"r{i}" / "fz", seed=5, progress=False)
        for i in range(2)
    ]
    assert strip_times(runs[0].manifest) == strip_times(runs[1].manifest)
    for adapter in runs[0].manifest["adapters"]:
        assert (tmp_path / "r0" / "fz" / adapter["path"] / "adapter.json").read_text() == (
            tmp_path / "r1" / "fz" / adapter["path"] / "adapter.json"
        ).read_text()
    orders = {
        tuple(
            fuse(tasks, OracleLearner(oracle), tmp_path / f"s{s}" / "fz", seed=s, progress=False).manifest[
                "order"
            ]
        )
        for s in range(4)
    }
    assert len(orders) > 1


@pytest.mark.parametrize("interrupt_at", [1, 3, 6, 9])
def test_resume_after_interruption_ends_as_an_uninterrupted_run(tmp_path: Path, interrupt_at: int) -> None:
    tasks, oracle = _varied_problem()
    reference_learner = OracleLearner(oracle)
    reference = fuse(tasks, reference_learner, tmp_path / "ref" / "fz", seed=2, progress=False)
    out = tmp_path / "resumed" / "fz"
    with pytest.raises(Interrupted):
        fuse(tasks, OracleLearner(oracle, interrupt_at=interrupt_at), out, seed=2, progress=False)
    assert (out / STATE_DIR).exists() and not (out / MANIFEST).exists()
    resumed_learner = OracleLearner(oracle)
    resumed = fuse(tasks, resumed_learner, out, seed=2, progress=False)
    assert strip_times(resumed.manifest) == strip_times(reference.manifest)
    # the resumed run redid only the training after the last checkpoint
    done = len(reference_learner.train_calls) - len(resumed_learner.train_calls)
    assert 0 < done <= interrupt_at
    assert resumed_learner.train_calls == reference_learner.train_calls[done:]
    for adapter in reference.manifest["adapters"]:
        assert (tmp_path / "ref" / "fz" / adapter["path"] / "adapter.json").read_text() == (
            out / adapter["path"] / "adapter.json"
        ).read_text()


def test_finished_run_is_not_redone_and_foreign_output_is_refused(tmp_path: Path) -> None:
    tasks, oracle = _varied_problem()
    first = fuse(tasks, OracleLearner(oracle), tmp_path / "fz", run_fingerprint="one", progress=False)
    again = OracleLearner(oracle)
    second = fuse(tasks, again, tmp_path / "fz", run_fingerprint="one", progress=False)
    assert again.train_calls == [] and second.manifest == first.manifest
    with pytest.raises(ValueError, match="another run"):
        fuse(tasks, OracleLearner(oracle), tmp_path / "fz", run_fingerprint="two", progress=False)
    with pytest.raises(Interrupted):
        fuse(
            tasks,
            OracleLearner(oracle, interrupt_at=2),
            tmp_path / "half",
            run_fingerprint="one",
            progress=False,
        )
    with pytest.raises(ValueError, match="checkpoint of another run"):
        fuse(tasks, OracleLearner(oracle), tmp_path / "half", run_fingerprint="two", progress=False)


def test_custom_order_policy_and_manifest_paths(tmp_path: Path) -> None:
    @register_order_policy("reversed-for-test")
    def reversed_order(tasks: Sequence[FusionTask], rng: random.Random) -> list[str]:
        return [t.name for t in reversed(tasks)]

    tasks, oracle = _varied_problem()
    result = fuse(tasks, OracleLearner(oracle), tmp_path / "fz", policy="reversed-for-test", progress=False)
    assert result.manifest["order"] == [t.name for t in reversed(tasks)]
    manifest = load_manifest(tmp_path / "fz")
    assert lora_paths(manifest) == [
        f"{a['name']}={tmp_path.resolve() / 'fz' / a['name']}" for a in manifest["adapters"]
    ]

    with pytest.raises(ValueError, match="permutation"):
        fuse(tasks, OracleLearner(oracle), tmp_path / "bad", policy=lambda t, r: ["d0"], progress=False)


def test_decisions_read_val_and_the_test_split_is_measured_once_on_the_final_adapters(tmp_path: Path) -> None:
    """The test split drives nothing: with test accuracies far below every requirement the
    packing is the same as with test equal to val, and each task is measured on test once, with
    the weights its adapter is saved with."""
    names = "abcdef"
    base = dict.fromkeys(names, 0.95)
    load = {"a": 0.4, "b": 0.4, "c": 0.4, "d": 0.3, "e": 0.3, "f": 0.5}
    tasks = [FusionTask(n, 0.9) for n in names]
    oracle = capacity_oracle(base, load)
    learner = OracleLearner(oracle, test_oracle=lambda fused, task: 0.1 + 0.01 * len(fused))
    result = fuse(tasks, learner, tmp_path / "fz", policy="spec", progress=False)
    alike = fuse(tasks, OracleLearner(oracle), tmp_path / "same", policy="spec", progress=False)
    assert adapters_of(result.manifest) == adapters_of(alike.manifest) == [["a", "b"], ["c", "d", "e"], ["f"]]
    tested = [(task, tasks_in) for split, task, tasks_in, _ in learner.evaluations if split == "test"]
    assert tested == [(t, tuple(a)) for a in adapters_of(result.manifest) for t in a]
    for adapter in result.manifest["adapters"]:
        saved = json.loads((tmp_path / "fz" / adapter["path"] / "adapter.json").read_text())["weights"]
        for entry in adapter["tasks"]:
            weights = [w for split, task, _, w in learner.evaluations if split == "test" and task == entry["task"]]
            assert weights == [saved]
            assert entry["test_accuracy"] == pytest.approx(0.1 + 0.01 * len(adapter["tasks"]))
            assert entry["meets"] and not entry["test_meets"]
