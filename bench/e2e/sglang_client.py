"""SGLang's own serving benchmark (``python -m sglang.benchmark.serving``) as a child
process that imports it once and then runs one command line per request.

Importing the client costs 5-40 s (it pulls in much of ``sglang.srt``); a call runs it
several times, so a worker keeps it imported. Each run is the module's own ``cli_main()``
with ``sys.argv`` set to the command line, exactly as ``python -m`` would run it. The
worker's stdout and stderr (the client's printed report) go to a log file; the protocol is
one JSON line per run each way: ``{"argv": [...], "send_adapters": true}`` on its stdin,
``{"code": <exit code>, "error": ...}`` on the original stdout.

``send_adapters`` false (the no-LoRA floor) runs the same command line, ``--lora-name`` and
the distribution included, but sends every request without its adapter. The client draws
each request's adapter from numpy's generator between the draws of the arrival intervals
(``--lora-request-distribution skewed``), so a floor run without those flags would get other
arrival times than the LoRA systems' runs of the same seed; with them it gets the same
prompts at the same times, and its latencies pair with theirs request by request.

Where the ``datasets`` package is missing (the CPU install leaves it out), the client's
import of it fails although the ``random-ids`` dataset never uses it; the worker then
registers an empty ``datasets`` module whose ``load_dataset`` raises, so a dataset that
needs it fails loudly.

    python -m bench.e2e.sglang_client LOG     # then write JSON argv lists to its stdin
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import traceback
import types
from collections.abc import Sequence
from pathlib import Path

MODULE = "sglang.benchmark.serving"


class Worker:
    """The parent's handle on one worker process."""

    def __init__(self, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        repo = Path(__file__).resolve().parents[2]
        self.process = subprocess.Popen([sys.executable, "-m", "bench.e2e.sglang_client", str(self.log_path)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=repo,
                                        env=env, start_new_session=True)

    def run(self, argv: Sequence[str], timeout_s: float, send_adapters: bool = True) -> None:
        """Run the client with ``argv``; RuntimeError with the log tail if it fails."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"argv": list(argv), "send_adapters": send_adapters}) + "\n")
        self.process.stdin.flush()
        answer: list[str] = []
        reader = threading.Thread(target=lambda: answer.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not answer or not answer[0]:
            self.close()
            raise RuntimeError(f"{MODULE} gave no answer within {timeout_s:.0f} s:\n{self.log_tail()}")
        reply = json.loads(answer[0])
        if reply["code"] not in (0, None):
            raise RuntimeError(f"{MODULE} exited with {reply['code']}: {reply.get('error')}\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@contextlib.contextmanager
def adapters_dropped(serving: types.ModuleType):
    """While inside, every request the client builds goes out without its adapter (the
    adapter is still drawn: see the module docstring)."""
    original = serving.RequestFuncInput

    def without_adapter(*args: object, **kwargs: object):
        request = original(*args, **kwargs)
        request.lora_name = None
        return request

    serving.RequestFuncInput = without_adapter
    try:
        yield
    finally:
        serving.RequestFuncInput = original


def _serve(log_path: str) -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    log = open(log_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    if importlib.util.find_spec("datasets") is None:
        missing = types.ModuleType("datasets")

        def load_dataset(*_args: object, **_kwargs: object) -> None:
            raise RuntimeError("the `datasets` package is not installed here; use --dataset-name random-ids")

        missing.load_dataset = load_dataset
        sys.modules["datasets"] = missing
    serving = importlib.import_module(MODULE)
    for line in sys.stdin:
        job = json.loads(line)
        argv, send_adapters = job["argv"], job["send_adapters"]
        note = "" if send_adapters else "   (requests sent without their adapters)"
        print(f"\n$ python -m {MODULE} {' '.join(argv)}{note}", flush=True)
        sys.argv = [MODULE, *argv]
        reply: dict[str, object] = {"code": 0}
        try:
            with contextlib.nullcontext() if send_adapters else adapters_dropped(serving):
                serving.cli_main()
        except SystemExit as e:
            reply["code"] = e.code if isinstance(e.code, int) else (1 if e.code else 0)
            reply["error"] = None if isinstance(e.code, int | None) else str(e.code)
        except Exception as e:  # reported to the parent, the worker stays up
            traceback.print_exc()
            reply = {"code": 1, "error": f"{type(e).__name__}: {e}"}
        protocol.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    _serve(sys.argv[1])
