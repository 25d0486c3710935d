#!/usr/bin/env bash
# GPU check: every inference mode with decode and prefill CUDA graphs ON, in a real SGLang server.
#
# Starts two servers with the plugin on the tiny Qwen2-VL and adapters a8/b16/c32: one with
# decode CUDA graphs (SGLang's default on a GPU) and prefill CUDA graphs (SGLang's breakable
# capture, PREFILL_GRAPH_FLAGS; SGLang leaves them off for this multimodal architecture unless
# asked), one with --disable-cuda-graph. On each it
# runs the phases unmerge -> POST /vlora/mode merge a8 -> mixture b16 -> unmerge; in each
# phase one /generate call of 8 requests (2 prompts x {base, a8, b16, c32}: one mixed decode
# batch) and two teacher-forced scorings (prefill, return_logprob over given input_ids).
# Checks, each printed PASS/FAIL with its largest log-prob difference:
#   decode-vs-prefill  every request's decode log-probs (graph replays on the graph server)
#                      equal the prefill's log-probs of the same tokens, in every mode;
#   modes              a fixed token sequence scores the same in every mode as unmerged;
#   graph-vs-nograph   decode log-probs (over the tokens both servers chose) and scores agree;
#   restored           unmerged again = unmerged at first (tokens identical);
#   merged-alone       with a8 merged, a8's requests alone (batches without LoRA work: the base
#                      layers only, the base-only decode graph) and base requests alone (only
#                      -a8 items) decode as unmerged, and as the server without graphs does;
#   adapters-matter    the adapters change the scores by more than 10x the tolerance (so a mode
#                      that dropped an adapter would fail every comparison above by that margin);
#   eager-in-gemm      where the pool's rows are appended (--vlora-shrink-in-gemm), the server
#                      without graphs ran its eager batches with the shrink inside the base GEMM
#                      (/vlora/status lora_batches.eager_in_gemm), so the comparisons above
#                      checked that path against the graph server's in every mode;
#   prefill-graph      the graph server prepared its prefills for the prefill graph (/vlora/status
#                      lora_batches) and its log shows prefill batches replayed as graphs, so the
#                      scores above compared prefill-graph replays with eager prefills (skipped
#                      with PREFILL_GRAPH_FLAGS="").
# Exit status 1 if any check fails. Results JSON: $OUT/gpu_check_graph_server.json (if $OUT).
#
# Usage (repo root, on a GPU machine where SGLang 0.5.23 imports):
#   bash bench/gpu_check_graph_server.sh [float32|bfloat16]
# Environment: PREFILL_GRAPH_FLAGS (the graph server's prefill-graph flags; default
# "--cuda-graph-backend-prefill breakable --cuda-graph-max-bs-prefill 512"),
# DTYPE (default float32), TOL (log-prob tolerance; default 1e-2 for float32,
# whose Triton dots run in TF32, 0.25 for bfloat16), TINY (tiny model dir, default /tmp/tiny,
# built with `python -m sglang_vlora.tiny_model` if missing; falls back to .cache/tiny).
# Dry run on a CPU machine (no graphs there; checks the script): SERVER_FLAGS=""
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
DTYPE=${1:-${DTYPE:-float32}}
case $DTYPE in float32) DEF_TOL=1e-2 ;; bfloat16) DEF_TOL=0.25 ;; *) echo "dtype must be float32 or bfloat16"; exit 2 ;; esac
TOL=${TOL:-$DEF_TOL}
if [ -n "${SGLANG_ENV_SCRIPT:-}" ]; then source "$SGLANG_ENV_SCRIPT"; fi  # optional: sets up SGLang
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
WORK=$(mktemp -d /tmp/vlora_graph_check.XXXXXX)
LOGS=${OUT:-$WORK}
mkdir -p "$LOGS"

# The plugin's entry point without installing the package: a dist-info on the path.
if ! python3 -c "import importlib.metadata as m, sys; sys.exit(0 if any(e.name == 'vlora' for e in m.entry_points(group='sglang.srt.plugins')) else 1)"; then
  mkdir -p "$WORK/ep/sglang_vlora-0.0.0.dist-info"
  printf 'Metadata-Version: 2.1\nName: sglang-vlora\nVersion: 0.0.0\n' > "$WORK/ep/sglang_vlora-0.0.0.dist-info/METADATA"
  printf '[sglang.srt.plugins]\nvlora = sglang_vlora.plugin:register\n' > "$WORK/ep/sglang_vlora-0.0.0.dist-info/entry_points.txt"
  export PYTHONPATH=$WORK/ep:$PYTHONPATH
fi

TINY=${TINY:-/tmp/tiny}
if [ ! -f "$TINY/model/config.json" ] && ! python3 -m sglang_vlora.tiny_model --out "$TINY" > "$LOGS/tiny_model.log" 2>&1; then
  if [ -f .cache/tiny/model/config.json ]; then TINY=.cache/tiny; else
    echo "FAIL could not build the tiny model (see $LOGS/tiny_model.log)"; exit 1; fi
fi
echo "model: $TINY/model  dtype: $DTYPE  tolerance: $TOL  logs: $LOGS"

# SERVER_FLAGS replaces the GPU flags (a dry run of this script on a CPU machine: SERVER_FLAGS="").
FLAGS=${SERVER_FLAGS---attention-backend triton --sampling-backend pytorch --mm-attention-backend sdpa --mem-fraction-static 0.85 --max-total-tokens 16384}
PREFILL_GRAPH_FLAGS=${PREFILL_GRAPH_FLAGS---cuda-graph-backend-prefill breakable --cuda-graph-max-bs-prefill 512}

# Both servers start at once (the tiny model needs little memory: one start-up time), through the
# launcher the tests and the end-to-end benchmark use (sglang_vlora/server_process.py); the
# checks stop them when they end.
python3 - "$TINY" "$DTYPE" "$TOL" "${OUT:-}" "$LOGS" "$FLAGS" "$PREFILL_GRAPH_FLAGS" <<'EOF'
import atexit
import json
import random
import shlex
import sys
import urllib.error
import urllib.request
from pathlib import Path

from sglang_vlora import server_process

TINY, DTYPE, TOL, OUT, LOGS, FLAGS = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], Path(sys.argv[5]), shlex.split(sys.argv[6])
PREFILL_GRAPH = shlex.split(sys.argv[7])


def start(name, extra):
    adapters = {a: Path(TINY) / "adapters" / a for a in ("a8", "b16", "c32")}
    flags = ["--plugin", "vlora", "--vlora-policy", "manual", "--dtype", DTYPE, "--max-lora-rank", "32",
             "--max-loras-per-batch", "4", *FLAGS, *extra]
    command = server_process.server_command(Path(TINY) / "model", adapters, flags)
    return server_process.start(command, LOGS / f"server_{name}.log", name=name)


SERVERS = {"graph": start("graph", ["--cuda-graph-max-bs-decode", "16", *PREFILL_GRAPH]),
           "nograph": start("nograph", ["--disable-cuda-graph"])}
atexit.register(lambda: [server_process.stop(s) for s in SERVERS.values()])
for srv in SERVERS.values():
    reason = server_process.wait_healthy(srv, timeout_s=600)
    if reason:
        print(f"FAIL server {srv.name}: {reason}\n{srv.log_tail(40)}")
        sys.exit(1)
if "capture" not in (LOGS / "server_graph.log").read_text(errors="replace").lower():
    print("WARN no CUDA-graph capture in the graph server's log: check that decode graphs are on")
URL = {name: srv.url for name, srv in SERVERS.items()}
ADAPTERS = [None, "a8", "b16", "c32"]
PHASES = [("unmerge", None), ("merge", "a8"), ("mixture", "b16"), ("unmerge", None)]
NEW = 12
rng = random.Random(0)
BASE_PROMPTS = [[rng.randrange(3, 1000) for _ in range(14)] for _ in range(2)]  # no special tokens (>= 1016)
PROMPTS = [p for p in BASE_PROMPTS for _ in ADAPTERS]
LORAS = [a for _ in BASE_PROMPTS for a in ADAPTERS]
L = len(BASE_PROMPTS[0])
results, failed = [], []


def post(server, path, body):
    req = urllib.request.Request(URL[server] + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def generate(server, prompts=PROMPTS, loras=LORAS):
    """One call, 8 requests on mixed adapters: one decode batch (graph replays)."""
    status, out = post(server, "/generate", {
        "input_ids": prompts, "lora_path": loras, "return_logprob": True,
        "sampling_params": {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True},
    })
    assert status == 200, out
    return [{"tokens": [t[1] for t in o["meta_info"]["output_token_logprobs"]],
             "logprobs": [t[0] for t in o["meta_info"]["output_token_logprobs"]]} for o in out]


def score(server, seqs, prompts=PROMPTS, loras=LORAS):
    """Teacher forcing: the prefill's log-prob of every token of seqs[i] after prompts[i],
    up to the first token SGLang does not take as given (a generated multimodal pad
    token is replaced in input_ids: what follows has another context)."""
    status, out = post(server, "/generate", {
        "input_ids": [p + s for p, s in zip(prompts, seqs)], "lora_path": loras,
        "return_logprob": True, "logprob_start_len": L - 1,  # the first entry has no log-prob
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
    })
    assert status == 200, out
    scores = []
    for o, s in zip(out, seqs):
        entries = o["meta_info"]["input_token_logprobs"][1:]
        assert len(entries) == len(s), "input_token_logprobs do not line up with the input"
        kept = []
        for (logprob, token, _), want in zip(entries, s):
            if token != want:
                break
            kept.append(logprob)
        scores.append(kept)
    return scores


def coverage(scores):
    return sum(map(len, scores)) / (len(scores) * NEW)


def check(name, diffs, ok=None, note=""):
    worst = max(diffs, default=0.0)
    passed = (worst <= TOL) if ok is None else ok
    print(f"{'PASS' if passed else 'FAIL'} {name}: max |d logprob| {worst:.3g}{' ' + note if note else ''}")
    results.append({"check": name, "pass": passed, "max_diff": worst, "note": note})
    if not passed:
        failed.append(name)


def common_prefix_diffs(a, b):
    """Log-prob differences where both runs had the same context (up to the first
    differing token, included: its log-prob is still conditioned on equal contexts)."""
    diffs, n = [], 0
    for ta, la, tb, lb in zip(a["tokens"], a["logprobs"], b["tokens"], b["logprobs"]):
        if ta == tb:
            diffs.append(abs(la - lb))
            n += 1
        else:
            break
    return diffs, n


# Fixed sequences scored in every phase: per prompt, the base request's greedy tokens.
first = generate("graph")
ref = [first[len(ADAPTERS) * (j // len(ADAPTERS))]["tokens"] for j in range(len(PROMPTS))]
runs = {}


def flush_cache(server):
    """Empty the radix cache: every phase then prefills its prompts whole, as the first did.
    With the prompts cached, a later phase's prefill is a few tokens, which the server without
    graphs runs through another kernel than the first phase's (small eager batches run one
    kernel a module), and a near-tie of the tiny model can pick another token after that."""
    req = urllib.request.Request(URL[server] + "/flush_cache", b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


for server in URL:
    for i, (mode, adapter) in enumerate(PHASES):
        status, body = post(server, "/vlora/mode", {"mode": mode, "adapter": adapter})
        check(f"{server} phase {i} {mode} {adapter}: POST /vlora/mode", [], ok=status == 200, note=str(body)[:120])
        check(f"{server} phase {i}: POST /flush_cache", [], ok=flush_cache(server) == 200)
        gen = generate(server)
        runs[server, i] = {"gen": gen, "own": score(server, [g["tokens"] for g in gen]), "ref": score(server, ref)}

for server in URL:
    for i, (mode, adapter) in enumerate(PHASES):
        run = runs[server, i]
        diffs = [abs(a - b) for g, s in zip(run["gen"], run["own"]) for a, b in zip(g["logprobs"], s)]
        cov = coverage(run["own"])
        check(f"decode-vs-prefill {server} {mode} {adapter or ''}", diffs, ok=max(diffs) <= TOL and cov >= 0.5,
              note=f"{cov:.0%} of the tokens compared")
        if i:
            diffs = [abs(a - b) for s, t in zip(run["ref"], runs[server, 0]["ref"]) for a, b in zip(s, t)]
            check(f"modes {server} {mode} {adapter or ''} = unmerge (scores of fixed tokens)", diffs)
for i, (mode, adapter) in enumerate(PHASES):
    g, n = runs["graph", i], runs["nograph", i]
    diffs, shared = [], []
    for a, b in zip(g["gen"], n["gen"]):
        d, k = common_prefix_diffs(a, b)
        diffs += d
        shared.append(k)
    # near-ties of a random tiny model may pick other tokens after a while: compare
    # up to there, but at least the prefill token and one decode step
    ok = max(diffs, default=0.0) <= TOL and min(shared) >= 2
    check(f"graph-vs-nograph decode {mode} {adapter or ''}", diffs, ok=ok, note=f"shared tokens per request {shared}")
    diffs = [abs(a - b) for s, t in zip(g["ref"], n["ref"]) for a, b in zip(s, t)]
    check(f"graph-vs-nograph scores {mode} {adapter or ''}", diffs)
for server in URL:
    first, last = runs[server, 0], runs[server, len(PHASES) - 1]
    same = all(a["tokens"] == b["tokens"] for a, b in zip(first["gen"], last["gen"]))
    diffs = [abs(x - y) for a, b in zip(first["gen"], last["gen"]) for x, y in zip(a["logprobs"], b["logprobs"])]
    check(f"restored {server}: unmerged again = unmerged first", diffs, ok=same and max(diffs) <= TOL)
# One kind of request alone with a8 merged: a8's (batches without LoRA work: the base layers
# only, the base-only decode graph) and the base model's (only -a8 items: the LoRA graph).
GROUPS = {"a8": ["a8"] * len(BASE_PROMPTS), "base": [None] * len(BASE_PROMPTS)}
alone = {}
for server in URL:
    for mode, adapter in (("merge", "a8"), ("unmerge", None)):
        status, body = post(server, "/vlora/mode", {"mode": mode, "adapter": adapter})
        check(f"{server} alone {mode} {adapter}: POST /vlora/mode", [], ok=status == 200, note=str(body)[:120])
        for group, loras in GROUPS.items():
            gen = generate(server, BASE_PROMPTS, loras)
            own = score(server, [g["tokens"] for g in gen], BASE_PROMPTS, loras)
            alone[server, mode, group] = {"gen": gen, "own": own}


def agreement(name, pairs_of_runs):
    pairs = [common_prefix_diffs(a, b) for a, b in pairs_of_runs]
    diffs = [d for ds, _ in pairs for d in ds]
    check(name, diffs, ok=max(diffs, default=0.0) <= TOL and min(k for _, k in pairs) >= 2,
          note=f"shared tokens per request {[k for _, k in pairs]}")


for group in GROUPS:
    for server in URL:
        run = alone[server, "merge", group]
        diffs = [abs(a - b) for g, s in zip(run["gen"], run["own"]) for a, b in zip(g["logprobs"], s)]
        cov = coverage(run["own"])
        check(f"decode-vs-prefill {server} merge a8, {group} requests alone", diffs,
              ok=max(diffs) <= TOL and cov >= 0.5, note=f"{cov:.0%} of the tokens compared")
        agreement(f"merged-alone {server}: {group} requests with a8 merged = unmerged (decode)",
                  zip(run["gen"], alone[server, "unmerge", group]["gen"]))
    agreement(f"graph-vs-nograph decode merge a8, {group} requests alone",
              zip(alone["graph", "merge", group]["gen"], alone["nograph", "merge", group]["gen"]))
runs.update({(s, f"alone-{m}-{g}"): r for (s, m, g), r in alone.items()})

base_scores = runs["graph", 0]["ref"]
for k, adapter in enumerate(ADAPTERS[1:], start=1):
    step = len(ADAPTERS)
    diffs = [abs(a - b) for j in range(0, len(PROMPTS), step) for a, b in zip(base_scores[j + k], base_scores[j])]
    check(f"adapters-matter {adapter} vs base", diffs, ok=max(diffs) > 10 * TOL, note=f"(needs > {10 * TOL:.3g})")

if PREFILL_GRAPH:
    with urllib.request.urlopen(URL["graph"] + "/vlora/status", timeout=60) as r:
        batches = json.loads(r.read())["lora_batches"]
    prefills = [line for line in (LOGS / "server_graph.log").read_text(errors="replace").splitlines()
                if "Prefill batch" in line]
    replayed = sum("cuda graph: True" in line for line in prefills)
    check("prefill-graph: the graph server's prefills were prepared for and replayed as prefill graphs", [],
          ok=batches.get("prefill_graph", 0) > 0 and replayed > 0,
          note=f"lora_batches {batches}; {replayed} of {len(prefills)} logged prefill batches replayed a graph")

with urllib.request.urlopen(URL["nograph"] + "/vlora/status", timeout=60) as r:
    nograph = json.loads(r.read())
if nograph.get("shrink_in_gemm"):
    eager = nograph["lora_batches"]
    check("eager-in-gemm: the server without graphs ran its eager batches with the shrink inside the base GEMM", [],
          ok=eager.get("eager_in_gemm", 0) > 0, note=f"kinds {nograph['shrink_in_gemm']}; lora_batches {eager}")

print(f"{len(results) - len(failed)}/{len(results)} checks passed ({DTYPE}, tolerance {TOL})")
if OUT:
    from bench import provenance

    summary = {"passed": len(results) - len(failed), "checks": len(results), "failed": failed,
               "server_flags": shlex.join(FLAGS), "prefill_graph_flags": shlex.join(PREFILL_GRAPH)}
    with open(f"{OUT}/gpu_check_graph_server.json", "w") as f:
        json.dump({"dtype": DTYPE, "tolerance": TOL, "summary": summary, "provenance": provenance.record(),
                   "checks": results, "runs": {f"{s}/{i}": r for (s, i), r in runs.items()}}, f, indent=1)
sys.exit(1 if failed else 0)
EOF
status=$?
if grep -q "NotImplementedError" "$LOGS"/server_*.log 2>/dev/null; then
  echo "WARN a stand-in sgl_kernel op raised in a server (see $LOGS/server_*.log, \$SGL_SHIM_LOG)"
fi
exit $status
