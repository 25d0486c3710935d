"""What the servers of an end-to-end call did, counted from their logs: prefill work and
adapter loads per server.

    python bench/server_log_counts.py RESULTS.json LOGS.tar.gz [RESULTS.json LOGS.tar.gz ...] \\
        --out bench/results/e2e_server_log_counts_h200.json

``bench/gpu_e2e.sh`` writes each call's results JSON and its server and client logs
(``<tag>_logs.tar.gz``). Per server this counts SGLang's ``Prefill batch`` lines (new and
cached prompt tokens: the work the prefix cache saved) and its ``loaded weights for target
modules`` lines (an adapter copied into the LoRA memory pool), those of the measurements apart
from those before them (start-up and warm-up). A server gets requests only while it is
measured, and every measurement starts by emptying its prefix cache, so its measurements
are what its log holds from its first ``/flush_cache`` on. The results file gives the
revision and the provenance.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import provenance  # noqa: E402

PREFILL = re.compile(r"Prefill batch, #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)")
LOAD = re.compile(r"LoRA adapter '[^']*': loaded weights for target modules")
FLUSH = re.compile(r"GET /flush_cache")


def count(log_lines: list[str]) -> dict:
    """Prefill batches, new and cached tokens and adapter loads of one server's log, from its
    first flush (its first measurement) on; adapter loads before that apart."""
    counts = {"prefill_batches": 0, "new_tokens": 0, "cached_tokens": 0,
              "adapter_loads_before_measuring": 0, "adapter_loads_while_measuring": 0}
    measuring = False
    for line in log_lines:
        if FLUSH.search(line):
            measuring = True
        elif found := PREFILL.search(line):
            if measuring:
                counts["prefill_batches"] += 1
                counts["new_tokens"] += int(found.group(2))
                counts["cached_tokens"] += int(found.group(3))
        elif LOAD.search(line):
            counts["adapter_loads_while_measuring" if measuring else "adapter_loads_before_measuring"] += 1
    return counts


def server_logs(results: dict, logs_path: Path) -> dict[str, list[str]]:
    """The log lines of each server of a call (``<system>.log`` in its logs tarball), for the
    call's own systems only."""
    logs = {}
    with tarfile.open(logs_path) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if member.isfile() and name.endswith(".log") and name[:-4] in results["systems"]:
                logs[name[:-4]] = tar.extractfile(member).read().decode(errors="replace").splitlines()
    return logs


def call_counts(results_path: Path, logs_path: Path) -> dict:
    results = json.loads(results_path.read_text())
    servers = {name: count(lines) for name, lines in server_logs(results, logs_path).items()}
    return {"results": results_path.name, "run_id": results["run_id"],
            "extra_server_args": results.get("setup", {}).get("extra_server_args", []),
            "servers": servers, "provenance": provenance.record(results, results["date"])}


def read_calls(argv: list[str] | None, description: str, per_call) -> tuple[list[dict], argparse.Namespace]:
    """Parse ``RESULTS.json LOGS.tar.gz [...] --out FILE`` and run ``per_call(results, logs)``
    on every pair; returns the calls and the parsed arguments."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pairs", nargs="+", type=Path, help="results JSON and its logs tarball, repeated")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if len(args.pairs) % 2:
        ap.error("give a results JSON and its logs tarball for every call")
    return [per_call(r, logs) for r, logs in zip(args.pairs[::2], args.pairs[1::2], strict=True)], args


def write_calls(what: str, script: str, calls: list[dict], args: argparse.Namespace,
                extra: dict | None = None) -> dict:
    """The results file of ``calls`` (with the command and the calls' combined provenance, and
    ``extra``'s fields, e.g. figures over every call)."""
    doc = {"what": what, "command": " ".join(["python", script, *(p.name for p in args.pairs)]),
           "calls": calls, **(extra or {}), "provenance": provenance.combined([c["provenance"] for c in calls])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main(argv: list[str] | None = None) -> dict:
    calls, args = read_calls(argv, __doc__, call_counts)
    for call in calls:
        for name, c in call["servers"].items():
            print(f"{call['results']:48} {name:14} {c}")
    return write_calls("per server of each call, counted from its log: prefill batches, new and cached prompt tokens "
                       "inside the measurements, adapter loads into the LoRA pool before and during them",
                       "bench/server_log_counts.py", calls, args)


if __name__ == "__main__":
    main()
