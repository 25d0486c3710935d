"""Run the README's knowledge-fusion example and record it as bench/results/fusion_cpu.json.

    python -m sglang_vlora.tiny_model --out .cache/tiny
    python bench/fusion.py        # examples/fusion/tasks.yaml on .cache/tiny/model, one torch thread

The record holds the fusion manifest (every task's adapter, val and test accuracy, the
rollbacks, the time), the command, the setup and :func:`bench.provenance.record` (git revision,
versions, machine); ``python bench/report.py`` writes the README's and docs/trainer.md's figures
from it. Run it from a clean checkout of the commit under test (``git worktree add``), so the
recorded revision is the code that ran. The adapters go to a temporary folder unless ``--out``
is given.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import provenance  # noqa: E402
from bench.report import RESULTS  # noqa: E402
from sglang_vlora.trainer import cli  # noqa: E402
from sglang_vlora.trainer.spec import load_spec  # noqa: E402

SPEC = Path("examples/fusion/tasks.yaml")
BASE = Path(".cache/tiny/model")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=SPEC, help="relative to the repository")
    parser.add_argument("--base", type=Path, default=BASE, help="base model folder, relative to the repository")
    parser.add_argument("--out", type=Path, help="where the adapters go (default: a temporary folder)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", type=Path, default=RESULTS / "fusion_cpu.json")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    record = {"provenance": provenance.record()}
    spec = load_spec(REPO / args.spec)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp) / "digits"
        cli.clear_output(out)
        started = time.perf_counter()
        result = cli.run_spec(spec, REPO / args.base, out, progress=False)
        wall = time.perf_counter() - started
    manifest = dict(result.manifest)
    for adapter in manifest["adapters"]:
        for task in adapter["tasks"]:
            task.pop("prompt_text", None)  # the chat text is rebuilt from the model; keep the record short
    record.update(
        spec=str(args.spec),
        command=f"vlora-fuse --spec {args.spec} --base {args.base} --out adapters/digits --threads {args.threads}",
        setup=f"tiny random Qwen2-VL of sglang_vlora.tiny_model, CPU, {args.threads} torch thread(s)",
        wall_s=round(wall, 1),
        manifest=manifest,
    )
    args.results.write_text(json.dumps(record, indent=2) + "\n")
    print(cli.summary(result.manifest))
    print(f"wrote {args.results.relative_to(REPO) if args.results.is_relative_to(REPO) else args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
