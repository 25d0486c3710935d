"""``vlora-fuse``: pack the datasets of a spec into few LoRA adapters (+ heads).

    vlora-fuse --spec tasks.yaml --base MODEL_DIR --out adapters/NAME

writes ``adapters/NAME/NAME-<i>/`` (adapter packages) and ``adapters/NAME/manifest.json``;
run it again after an interruption and it resumes from the last checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from sglang_vlora.trainer.fusion import MANIFEST, STATE_DIR, FusionResult, FusionTask, fingerprint, fuse
from sglang_vlora.trainer.spec import FusionSpec, load_spec


def _model_digest(base: Path) -> str:
    """Identify the base model by its config and weight file sizes (cheap, path independent)."""
    digest = hashlib.sha256((base / "config.json").read_bytes())
    for path in sorted(base.glob("*.safetensors")):
        digest.update(f"{path.name}:{path.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def run_spec(spec: FusionSpec, base: Path | str, out: Path | str, progress: bool = True) -> FusionResult:
    """Build the spec's datasets, train with :class:`VLMLearner` and fuse into ``out``."""
    from sglang_vlora.trainer.data import build_task
    from sglang_vlora.trainer.learner import TaskPlan, VLMLearner, render_prompt
    from sglang_vlora.trainer.metrics import METRICS

    base, out = Path(base), Path(out)
    plans = {}
    for task in spec.tasks:
        data = build_task(task.source, seed=spec.seed, name=task.name)
        plans[task.name] = TaskPlan(data=data, answer=task.answer, steps=task.steps)
    learner = VLMLearner(base, plans, lora=spec.lora, train=spec.train, progress=progress)
    info = {}
    for name, plan in plans.items():
        info[name] = {
            "answer": plan.answer,
            "task_type": plan.data.task_type,
            "metric": METRICS[plan.data.task_type].__name__,
            "prompt": plan.data.prompt,
            "prompt_text": render_prompt(learner.processor, plan.data.prompt),
            "labels": list(plan.data.labels),
            "n_train": len(plan.data.train),
            "n_val": len(plan.data.val),
            "n_test": len(plan.data.test),
            "source": plan.data.source,
        }
    run = fingerprint({"spec": spec.to_json(), "model": _model_digest(base)})
    result = fuse(
        [FusionTask(t.name, t.required) for t in spec.tasks],
        learner,
        out,
        seed=spec.seed,
        policy=spec.policy,
        run_fingerprint=run,
        task_info=info,
        progress=progress,
    )
    return result


def clear_output(out: Path) -> None:
    """Remove what an earlier run wrote in ``out``: checkpoint, manifest, ``<out name>-<i>`` adapters."""
    shutil.rmtree(out / STATE_DIR, ignore_errors=True)
    (out / MANIFEST).unlink(missing_ok=True)
    pattern = re.compile(re.escape(out.name) + r"-\d+")
    for child in out.glob(f"{out.name}-*"):
        if child.is_dir() and pattern.fullmatch(child.name):
            shutil.rmtree(child)


def summary(manifest: dict) -> str:
    """A plain-text table: adapter, task, val accuracy (what fusion decided on) and test
    accuracy (held out from every decision) vs requirement."""
    lines = [f"{'adapter':<20} {'task':<24} {'answer':<6} {'val':>6} {'test':>6} {'required':>8}"]
    for adapter in manifest["adapters"]:
        for task in adapter["tasks"]:
            flag = "" if task["meets"] else "  BELOW"
            flag += "" if task["test_meets"] or not task["meets"] else "  (test below)"
            lines.append(
                f"{adapter['name']:<20} {task['task']:<24} {task.get('answer', ''):<6} "
                f"{task['val_accuracy']:>6.3f} {task['test_accuracy']:>6.3f} {task['required']:>8.2f}{flag}"
            )
    lines.append(
        f"{len(manifest['order'])} datasets -> {len(manifest['adapters'])} adapters "
        f"({manifest['tasks_per_adapter']} per adapter), {manifest['train_seconds']} s of training and evaluation"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vlora-fuse", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, type=Path, help="tasks.yaml")
    parser.add_argument("--base", required=True, type=Path, help="base model folder (transformers format)")
    parser.add_argument("--out", required=True, type=Path, help="output folder; adapters are named after it")
    parser.add_argument("--seed", type=int, help="override the spec's seed")
    parser.add_argument("--policy", help="override the spec's dataset order policy")
    parser.add_argument(
        "--restart", action="store_true", help="discard an earlier run's output and checkpoint"
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    spec = load_spec(args.spec)
    overrides = {k: v for k, v in (("seed", args.seed), ("policy", args.policy)) if v is not None}
    spec = dataclasses.replace(spec, **overrides)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.restart:
        clear_output(args.out)
    from tqdm.contrib.logging import logging_redirect_tqdm

    with logging_redirect_tqdm():
        result = run_spec(spec, args.base, args.out, progress=not args.quiet)
    print(summary(result.manifest))
    print(json.dumps({"manifest": str(result.path)}))
    all_met = all(t["meets"] for a in result.manifest["adapters"] for t in a["tasks"])
    return 0 if all_met else 2


if __name__ == "__main__":
    sys.exit(main())
