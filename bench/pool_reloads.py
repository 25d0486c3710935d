"""How often SGLang reloads adapters into its LoRA pool when the pool has one slot per adapter.

    python bench/pool_reloads.py [--out bench/results/pool_reloads_cpu.json]

Serves the tiny CPU model (``python -m sglang_vlora.tiny_model --out .cache/tiny`` builds it)
with its three adapters and ``--max-loras-per-batch 3``, sends requests one at a time round
robin over the adapters, then one base-model request, then more rounds, and counts SGLang's
``loaded weights for target modules`` log lines after each step. SGLang's own start-up
request runs on the base model, which then holds a pool slot until a batch of adapters alone
needs it; meanwhile the three adapters share two slots. Writes the counts with provenance.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import provenance  # noqa: E402
from sglang_vlora import server_process  # noqa: E402

ADAPTERS = ("a8", "b16", "c32")
LOADED = "loaded weights for target modules"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", type=Path, default=REPO / ".cache" / "tiny")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "pool_reloads_cpu.json")
    ap.add_argument("--log", type=Path, default=REPO / ".cache" / "bench" / "pool_reloads.log")
    args = ap.parse_args(argv)
    model = args.tiny / "model"
    adapters = {name: args.tiny / "adapters" / name for name in ADAPTERS}
    missing = [str(p) for p in (model, *adapters.values()) if not p.exists()]
    if missing:
        raise SystemExit(f"missing {missing}: build them with python -m sglang_vlora.tiny_model --out {args.tiny}")
    flags = ["--plugin", "vlora", "--vlora-policy", "unmerge-only", "--dtype", "float32", "--max-lora-rank", "32",
             "--max-loras-per-batch", str(len(ADAPTERS))]
    command = server_process.server_command(model, adapters, flags)
    server = server_process.launch(command, args.log, 600, model_dir=model, adapters=adapters)
    steps = []
    try:
        def generate(adapter: str | None) -> None:
            body = {"text": "hello there", "sampling_params": {"max_new_tokens": 2}}
            if adapter:
                body["lora_path"] = adapter
            httpx.post(server.url + "/generate", json=body, timeout=120).raise_for_status()

        def step(what: str, adapters_in_order: list[str | None]) -> None:
            for adapter in adapters_in_order:
                generate(adapter)
            steps.append({"sent": what, "requests": len(adapters_in_order),
                          "loads_so_far": args.log.read_text().count(LOADED)})
            print(steps[-1])

        step("one request per adapter", list(ADAPTERS))
        step("two more rounds, one request at a time", list(ADAPTERS) * 2)
        step("one base-model request", [None])
        step("two more rounds", list(ADAPTERS) * 2)
    finally:
        server_process.stop(server)
    doc = {"what": __doc__.split("\n\n")[0], "command": " ".join(["python", "bench/pool_reloads.py", *(argv or [])]),
           "max_loras_per_batch": len(ADAPTERS), "adapters": list(ADAPTERS), "steps": steps,
           "provenance": provenance.record()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    main()
