"""A package with a task head, made by hand: the tiny c32 adapter plus an untrained
six-label head (the format demo; `vlora-fuse` trains real ones). Writes
adapters/objects-head and checks it as the server will.

    python adapters/recipes/objects_head.py [--tiny .cache/tiny]
"""

import argparse
import shutil
import sys
from pathlib import Path

import torch

from sglang_vlora import adapters
from sglang_vlora.heads.task_head import HeadSpec, TaskHead

LABELS = ("cat", "dog", "car", "tree", "person", "bus")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", default=".cache/tiny", help="output of adapters/recipes/tiny.sh")
    parser.add_argument("--out", default="adapters/objects-head")
    args = parser.parse_args()
    tiny, out = Path(args.tiny), Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(tiny / "adapters" / "c32", out)
    torch.manual_seed(0)
    head = TaskHead(HeadSpec(task="object-class", labels=LABELS, prompt="What is in the image?"), hidden_size=128)
    adapters.save_heads([head], out)
    return adapters.main(["check", str(out), "--model", str(tiny / "model")])


if __name__ == "__main__":
    sys.exit(main())
