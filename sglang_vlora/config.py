"""VLoRA options: one dataclass, parsed from ``--vlora-*`` flags, passed to children.

SGLang spawns its scheduler and detokenizer processes and rebuilds ``ServerArgs``
from its own fields only, so our options travel in the environment variable
:data:`ENV_VAR` (JSON), which spawned processes inherit.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, fields

from sglang_vlora.orchestrator.policy import ADMISSIONS, KEEP_MERGED

ENV_VAR = "SGLANG_VLORA_CONFIG"
PLUGIN_NAME = "vlora"
ATMM_IMPLS = ("auto", "torch")
# "manual": no orchestrator; modes change only through POST /vlora/mode.
POLICIES = ("vlora", "merge-only", "unmerge-only", "dlora", "manual")
NEVER_MERGES = "unmerge-only"  # the policy under which no adapter is ever merged
SHRINK_IN_GEMM = ("auto", "on", "off")
LORA_GEMM = ("off", "on")
# Largest --vlora-eager-in-gemm-max-tokens: the eager in-GEMM items keep a device entry per token
# up to the limit, allocated at the first such batch; far past any prefill chunk SGLang runs.
EAGER_IN_GEMM_TOKENS_CAP = 65536
# Largest --vlora-eager-small-gemm-max-tokens: each program of that kernel recomputes its rows'
# shrink and re-reads its weight tile per 16 rows; past a few hundred tokens the GPU's time
# would outgrow the host time it saves.
EAGER_SMALL_GEMM_TOKENS_CAP = 256
POPULAR_WINDOW_CAP = 4096  # arrivals; a longer window would not follow a shift of popularity within minutes
# Prepared ATMM launches go straight to the CUDA driver (atmm.driver_launch) unless this is
# "0": Triton's launcher then runs them, for comparison (bench/layer_cost.py) or as a way out.
DIRECT_LAUNCH_ENV = "SGLANG_VLORA_DIRECT_LAUNCH"
# The in-GEMM expand is launched with programmatic dependent launch on Hopper and later GPUs
# (atmm.triton_kernels.expand_pdl) unless this is "0": for comparison (bench/expand_pdl.py).
PDL_ENV = "SGLANG_VLORA_PDL"
# Threads that compile a shape's Triton variants ahead at once (atmm.launch_compiles); unset:
# the CPUs the process may run on, at most COMPILE_WORKERS_CAP; "1": one at a time.
COMPILE_WORKERS_ENV = "SGLANG_VLORA_COMPILE_WORKERS"
COMPILE_WORKERS_CAP = 8


def direct_launch_setting() -> bool:
    """``SGLANG_VLORA_DIRECT_LAUNCH``: unset or ``1`` on, ``0`` off; anything else is refused
    (a ``false`` that silently meant on would hide which launcher a measurement used)."""
    return _on_off(DIRECT_LAUNCH_ENV)


def pdl_setting() -> bool:
    """``SGLANG_VLORA_PDL``: unset or ``1`` on, ``0`` off; anything else is refused."""
    return _on_off(PDL_ENV)


def compile_workers_setting() -> int:
    """``SGLANG_VLORA_COMPILE_WORKERS``: a whole number from 1; unset: the CPUs this process
    may run on, at most :data:`COMPILE_WORKERS_CAP`. Anything else is refused."""
    value = os.environ.get(COMPILE_WORKERS_ENV)
    if value is None:
        return max(1, min(COMPILE_WORKERS_CAP, len(os.sched_getaffinity(0))))
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{COMPILE_WORKERS_ENV} must be a whole number from 1, got {value!r}")
    return int(value)


def _on_off(name: str) -> bool:
    value = os.environ.get(name, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


@dataclass(frozen=True)
class VLoRAConfig:
    """Options of an active plugin (``--plugin vlora``)."""

    # Which ATMM implementation runs: "auto" picks the fastest available for the
    # tensors' device (kernels on GPU, the torch reference on CPU); "torch" forces
    # the reference everywhere (debugging, parity checks).
    atmm_impl: str = "auto"
    # Apply serving defaults for machines without a GPU (device, attention
    # backends, overlap scheduling, KV size) to flags the user did not set.
    cpu_defaults: bool = True
    # KV-cache size in tokens used by the CPU defaults.
    cpu_max_total_tokens: int = 65536
    # Scheduling policy that picks mode, merged adapter and batch every iteration
    # (sglang_vlora.orchestrator); the comparison policies exist for benchmarks.
    policy: str = "vlora"
    # Starvation threshold on a request's credit, seconds (Algorithm 1's theta); None: derived
    # by the orchestrator from measured request execution times.
    theta: float | None = None
    # Requests per iteration the policy plans for; None: derived from the requests in flight.
    max_batch: int | None = None
    # While an adapter is merged: "algorithm1" holds the other adapters' requests back until they
    # starve, as the paper does; "all" admits them too (they run in mixture). The default with
    # keep_merged "plurality": at least as fast as the paper's rules on the H200 (docs/orchestrator.md).
    admission: str = "all"
    # Once an adapter is merged: "majority" unmerges when Algorithm 1's line 5 fails, as the paper
    # does; "plurality" keeps it merged while it is the most-requested adapter and at most half of
    # the max batch starve; "popular" also while it has more than popular_share of the recent arrivals.
    keep_merged: str = "plurality"
    # Share of the last popular_window arrivals above which an adapter is popular: entering a
    # merge needs it, and keep_merged "popular" keeps a merged adapter while it lasts.
    popular_share: float = 0.5
    # Arrivals (base-model requests included) that tell which adapter is popular. A longer window
    # separates a skewed top adapter from a uniform one better but follows a shift more slowly
    # (docs/orchestrator.md, "The popularity gate at Zipf 2").
    popular_window: int = 32
    # Cost model JSON (schema sglang-vlora/cost-model/v1); None: measured while serving.
    cost_model: str | None = None
    # Largest image a request may send, in pixels (width x height), checked from the image's
    # header before it is decoded. 32 Mi pixels: an 8192 x 4096 image.
    max_image_pixels: int = 32 * 1024 * 1024
    # Graph batches' (and small eager batches') shrink inside the base GEMM, the pool's A rows
    # appended to the base weights (sglang_vlora.in_gemm_weights): "auto" where eligible on a
    # GPU and the appended rows are at most half the module's own; "on" wherever eligible (any
    # device, any row count); "off" never.
    shrink_in_gemm: str = "auto"
    # Eager batches (prefills without prefill graphs or above their largest, decode batches
    # above the decode graphs') of at most this many tokens compute the shrink inside the base
    # GEMM as graph batches do, on the layers with the appended rows: one launch a module fewer
    # (an eager forward is bound by the host's launches). 0: eager batches keep their own shrink.
    eager_in_gemm_max_tokens: int = 1536
    # Of those, unmerged eager batches of at most this many tokens run each such module's base
    # GEMM, shrink and expand as one kernel (sglang_vlora.atmm.small_gemm): one launch a module,
    # and no torch GEMM call's host time. 0: never.
    eager_small_gemm_max_tokens: int = 64
    # Eager batches' LoRA inside ATMM's own base GEMM (ops.lora_apply_gemm): "on" for unmerged
    # eager batches of at least lora_gemm_min_tokens tokens, on layers with the appended-rows
    # stack (shrink_in_gemm), where the op supports the operands; "off" (default) never: on
    # Qwen2-VL-7B's q/k/v and o shapes it saved no GPU time and cost host time (docs/atmm.md).
    lora_gemm: str = "off"
    lora_gemm_min_tokens: int = 1024

    def __post_init__(self) -> None:
        if self.atmm_impl not in ATMM_IMPLS:
            raise ValueError(f"--vlora-atmm-impl must be one of {ATMM_IMPLS}, got {self.atmm_impl!r}")
        if self.cpu_max_total_tokens <= 0:
            raise ValueError("--vlora-cpu-max-total-tokens must be positive")
        if self.policy not in POLICIES:
            raise ValueError(f"--vlora-policy must be one of {POLICIES}, got {self.policy!r}")
        if self.theta is not None and (not self.theta >= 0 or self.theta == float("inf")):
            raise ValueError(f"--vlora-theta must be a finite number of seconds >= 0, got {self.theta}")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"--vlora-admission must be one of {ADMISSIONS}, got {self.admission!r}")
        if self.keep_merged not in KEEP_MERGED:
            raise ValueError(f"--vlora-keep-merged must be one of {KEEP_MERGED}, got {self.keep_merged!r}")
        if not 0 <= self.popular_share < 1:
            raise ValueError(f"--vlora-popular-share must be in [0, 1), got {self.popular_share}")
        if not 1 <= self.popular_window <= POPULAR_WINDOW_CAP:
            raise ValueError(f"--vlora-popular-window must be between 1 and {POPULAR_WINDOW_CAP}, "
                             f"got {self.popular_window}")
        if self.max_batch is not None and self.max_batch < 1:
            raise ValueError(f"--vlora-max-batch must be >= 1, got {self.max_batch}")
        if self.max_image_pixels < 1:
            raise ValueError(f"--vlora-max-image-pixels must be >= 1, got {self.max_image_pixels}")
        if self.shrink_in_gemm not in SHRINK_IN_GEMM:
            raise ValueError(f"--vlora-shrink-in-gemm must be one of {SHRINK_IN_GEMM}, got {self.shrink_in_gemm!r}")
        if not 0 <= self.eager_in_gemm_max_tokens <= EAGER_IN_GEMM_TOKENS_CAP:
            raise ValueError(f"--vlora-eager-in-gemm-max-tokens must be between 0 and {EAGER_IN_GEMM_TOKENS_CAP}, "
                             f"got {self.eager_in_gemm_max_tokens}")
        if not 0 <= self.eager_small_gemm_max_tokens <= EAGER_SMALL_GEMM_TOKENS_CAP:
            raise ValueError(f"--vlora-eager-small-gemm-max-tokens must be between 0 and "
                             f"{EAGER_SMALL_GEMM_TOKENS_CAP}, got {self.eager_small_gemm_max_tokens}")
        if self.lora_gemm not in LORA_GEMM:
            raise ValueError(f"--vlora-lora-gemm must be one of {LORA_GEMM}, got {self.lora_gemm!r}")
        if self.lora_gemm_min_tokens < 1:
            raise ValueError(f"--vlora-lora-gemm-min-tokens must be >= 1, got {self.lora_gemm_min_tokens}")
        if self.cost_model is not None and not os.path.isfile(self.cost_model):
            raise ValueError(f"--vlora-cost-model: no such file {self.cost_model!r}")

    def to_env(self) -> None:
        os.environ[ENV_VAR] = json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> VLoRAConfig | None:
        raw = os.environ.get(ENV_VAR)
        if not raw:
            return None
        values = json.loads(raw)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{ENV_VAR} has unknown options {unknown}")
        return cls(**values)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> VLoRAConfig:
        return cls(
            atmm_impl=args.vlora_atmm_impl,
            cpu_defaults=not args.vlora_no_cpu_defaults,
            cpu_max_total_tokens=args.vlora_cpu_max_total_tokens,
            policy=args.vlora_policy,
            theta=args.vlora_theta,
            max_batch=args.vlora_max_batch,
            admission=args.vlora_admission,
            keep_merged=args.vlora_keep_merged,
            popular_share=args.vlora_popular_share,
            popular_window=args.vlora_popular_window,
            cost_model=os.path.abspath(args.vlora_cost_model) if args.vlora_cost_model else None,
            max_image_pixels=args.vlora_max_image_pixels,
            shrink_in_gemm=args.vlora_shrink_in_gemm,
            eager_in_gemm_max_tokens=args.vlora_eager_in_gemm_max_tokens,
            eager_small_gemm_max_tokens=args.vlora_eager_small_gemm_max_tokens,
            lora_gemm=args.vlora_lora_gemm,
            lora_gemm_min_tokens=args.vlora_lora_gemm_min_tokens,
        )


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """The flags the plugin adds to ``sglang.launch_server``."""
    group = parser.add_argument_group("sglang-vlora")
    group.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="NAME",
        help=f"Turn on an installed SGLang plugin by name ('{PLUGIN_NAME}' for sglang-vlora). Repeatable.",
    )
    defaults = VLoRAConfig()
    group.add_argument(
        "--vlora-atmm-impl",
        choices=ATMM_IMPLS,
        default=defaults.atmm_impl,
        help="ATMM implementation: auto (kernels on GPU, torch on CPU) or torch (reference everywhere).",
    )
    group.add_argument(
        "--vlora-no-cpu-defaults",
        action="store_true",
        help="On a machine without a GPU, do not fill in the CPU serving defaults.",
    )
    group.add_argument(
        "--vlora-cpu-max-total-tokens",
        type=int,
        default=defaults.cpu_max_total_tokens,
        help="KV-cache size (tokens) set by the CPU defaults when --max-total-tokens is not given.",
    )
    group.add_argument(
        "--vlora-policy",
        choices=POLICIES,
        default=defaults.policy,
        help="Scheduling policy: vlora (Algorithm 1: merge / mixture / unmerge per iteration); "
        "merge-only, unmerge-only, dlora (comparison policies for benchmarks); manual (modes only "
        "through POST /vlora/mode).",
    )
    group.add_argument(
        "--vlora-theta",
        type=float,
        default=defaults.theta,
        help="Starvation threshold in seconds: a request whose credit (waiting time + expected "
        "execution + switch latency) exceeds it is served out of turn (default: 1.5 x the mean "
        "execution time of recently finished requests, shown in /vlora/status).",
    )
    group.add_argument(
        "--vlora-max-batch",
        type=int,
        default=None,
        help="Requests per iteration the policy plans for (default: derived from the requests in "
        "flight, capped by SGLang's max running requests and the largest decode CUDA graph; shown in "
        "/vlora/status).",
    )
    group.add_argument(
        "--vlora-admission",
        choices=ADMISSIONS,
        default=defaults.admission,
        help="While an adapter is merged (policy vlora): algorithm1 holds the other adapters' "
        "requests back until they starve, as the paper's Algorithm 1 does; all (default) admits them too "
        "(they run in mixture).",
    )
    group.add_argument(
        "--vlora-keep-merged",
        choices=KEEP_MERGED,
        default=defaults.keep_merged,
        help="Once an adapter is merged (policy vlora): majority unmerges as soon as line 5 of "
        "the paper's Algorithm 1 fails (it no longer holds more than half of the max batch, or more than "
        "half starve); plurality (default) keeps it merged while it is the most-requested adapter and at "
        "most half of the max batch starve; popular also keeps it while it has more than "
        "--vlora-popular-share of the recent arrivals, even when another adapter has more requests in flight (they run in mixture).",
    )
    group.add_argument(
        "--vlora-popular-share",
        type=float,
        default=defaults.popular_share,
        metavar="SHARE",
        help="An adapter is popular when it has more than this share of the last --vlora-popular-window "
        "arrivals (default 0.5): entering a merge needs it (policy vlora), and --vlora-keep-merged popular keeps a "
        "merged adapter while it lasts.",
    )
    group.add_argument(
        "--vlora-popular-window",
        type=int,
        default=defaults.popular_window,
        metavar="N",
        help=f"Arrivals that tell which adapter is popular (default {defaults.popular_window}, at most "
        f"{POPULAR_WINDOW_CAP}; base-model requests count): the window of --vlora-popular-share.",
    )
    group.add_argument(
        "--vlora-cost-model",
        default=None,
        metavar="JSON",
        help="Cost model file (schema sglang-vlora/cost-model/v1) with measured token latencies "
        "and switch times; default: measured while serving.",
    )
    group.add_argument(
        "--vlora-max-image-pixels",
        type=int,
        default=defaults.max_image_pixels,
        metavar="N",
        help="Largest image a request may send, in pixels (width x height); larger ones get a 400 "
        "before they are decoded.",
    )
    group.add_argument(
        "--vlora-shrink-in-gemm",
        choices=SHRINK_IN_GEMM,
        default=defaults.shrink_in_gemm,
        help="CUDA-graph batches (and eager batches up to --vlora-eager-in-gemm-max-tokens) compute the "
        "LoRA shrink inside the base GEMM, the adapter pool's A "
        "rows appended to the base weights (tensor parallelism 1, unquantized weights): auto (default) "
        "where the appended rows are at most half the module's own, on a GPU; on: wherever possible; "
        "off: never (the shrink runs as its own kernel).",
    )
    group.add_argument(
        "--vlora-eager-in-gemm-max-tokens",
        type=int,
        default=defaults.eager_in_gemm_max_tokens,
        metavar="N",
        help="Eager batches of at most N tokens compute the LoRA shrink inside the base GEMM too, on the "
        "layers that have the appended rows of --vlora-shrink-in-gemm (one kernel launch a module fewer); "
        "0: eager batches run the shrink as its own kernel; at most 65536 (default 1536).",
    )
    group.add_argument(
        "--vlora-eager-small-gemm-max-tokens",
        type=int,
        default=defaults.eager_small_gemm_max_tokens,
        metavar="N",
        help="Unmerged eager batches of at most N tokens (and at most --vlora-eager-in-gemm-max-tokens) run "
        "each module with the appended rows as one kernel: base GEMM, LoRA shrink and expand (one launch a "
        f"module instead of two; such forwards are bound by the host's launches); 0: never; at most "
        f"{EAGER_SMALL_GEMM_TOKENS_CAP} (default 64).",
    )
    group.add_argument(
        "--vlora-lora-gemm",
        choices=LORA_GEMM,
        default=defaults.lora_gemm,
        help="Eager batches (prefills past the prefill CUDA graphs) compute each layer's base GEMM "
        "and LoRA in one GEMM of the plugin's own, the LoRA delta added in its accumulator: on for "
        "unmerged batches of at least --vlora-lora-gemm-min-tokens tokens on the layers with the "
        "appended rows of --vlora-shrink-in-gemm, on a GPU, pool max rank a multiple of 8 up to 64; "
        "off (default): SGLang's base GEMM, then the plugin's shrink and expand.",
    )
    group.add_argument(
        "--vlora-lora-gemm-min-tokens",
        type=int,
        default=defaults.lora_gemm_min_tokens,
        metavar="N",
        help="Fewest tokens in an eager batch for --vlora-lora-gemm (default 1024).",
    )
