"""What the end-to-end benchmark runs: systems, points, scales and calls (pure Python).

A *point* is one workload at one load (e.g. 1024 input / 64 output tokens at 8 req/s, Zipf
alpha 2 over 4 adapters); a *measurement* is one point run once against one system's server;
a *call* is what one GPU command runs: a few systems' servers started side by side, then
every (repeat, point, system) measurement one at a time, in an order that rotates the
systems between repeats so that no system always goes first. The report merges the results
of any number of calls; every measurement of the same (system, point) is a repeat.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from bench import workloads


@dataclass(frozen=True)
class System:
    """One server configuration under test. ``lora``: adapters are loaded (every system but
    the no-LoRA floor); ``plugin``: ``--plugin vlora`` with ``policy`` (None: the plugin's
    defaults, as a user who sets nothing gets them)."""

    name: str
    about: str
    plugin: bool = False
    policy: str | None = None
    lora_backend: str | None = None
    lora: bool = True
    extra_flags: tuple[str, ...] = ()  # more plugin flags (a non-default setting under test)

    @property
    def needs_cuda(self) -> bool:
        """Plain SGLang (no plugin) does not start on a CPU-only machine, and its triton /
        csgmv LoRA kernels are Triton GPU kernels."""
        return not self.plugin

    def flags(self) -> list[str]:
        args = ["--plugin", "vlora"] if self.plugin else []
        if self.policy:
            args += ["--vlora-policy", self.policy]
        if self.lora_backend:
            args += ["--lora-backend", self.lora_backend]
        return args + list(self.extra_flags)


SYSTEMS = {s.name: s for s in (
    System("nolora", "no LoRA at all: plain SGLang, no adapters loaded (the floor)", lora=False),
    System("nolora_twin", "a second no-LoRA server, identical to the floor: what the harness reads between two "
           "identical systems (an A/A check of its resolution)", lora=False),
    System("vlora", "V-LoRA (ours): `--plugin vlora` with its defaults (ATMM, Algorithm 1 with the "
           "others admitted at once and a merged adapter kept while it is the most requested)", plugin=True),
    System("csgmv", "SGLang `--lora-backend csgmv` (its default; Punica-like SGMV)", lora_backend="csgmv"),
    System("triton", "SGLang `--lora-backend triton` (S-LoRA-like)", lora_backend="triton"),
    System("unmerge_only", "`--plugin vlora --vlora-policy unmerge-only` (ATMM alone)", plugin=True,
           policy="unmerge-only"),
    System("unmerge_only_lora_gemm", "`--plugin vlora --vlora-policy unmerge-only --vlora-lora-gemm on` (ATMM "
           "alone, eager prefills of 1024 tokens or more with the LoRA inside ATMM's GEMM instead of SGLang's "
           "base GEMM then ATMM's shrink and expand)", plugin=True, policy="unmerge-only",
           extra_flags=("--vlora-lora-gemm", "on")),
    System("unmerge_only_separate_shrink", "`--plugin vlora --vlora-policy unmerge-only "
           "--vlora-eager-in-gemm-max-tokens 0` (ATMM alone, every eager batch with its shrink as a kernel "
           "of its own, none inside the base GEMM)", plugin=True, policy="unmerge-only",
           extra_flags=("--vlora-eager-in-gemm-max-tokens", "0")),
    System("unmerge_only_in_gemm_1536", "`--plugin vlora --vlora-policy unmerge-only "
           "--vlora-eager-in-gemm-max-tokens 1536` (ATMM alone, eager batches of up to 1536 tokens with "
           "the shrink inside the base GEMM: the default since e84b16c, spelled out)", plugin=True,
           policy="unmerge-only", extra_flags=("--vlora-eager-in-gemm-max-tokens", "1536")),
    System("unmerge_only_in_gemm_2048", "`--plugin vlora --vlora-policy unmerge-only "
           "--vlora-eager-in-gemm-max-tokens 2048` (ATMM alone, eager batches of up to 2048 tokens with "
           "the shrink inside the base GEMM: every one-prompt batch of the benchmark's prefills)", plugin=True,
           policy="unmerge-only", extra_flags=("--vlora-eager-in-gemm-max-tokens", "2048")),
    System("unmerge_only_no_small_gemm", "`--plugin vlora --vlora-policy unmerge-only "
           "--vlora-eager-small-gemm-max-tokens 0` (ATMM alone without the one kernel of small eager batches: "
           "the plugin's eager path before bef3295, beside the code as it stands in one call)", plugin=True,
           policy="unmerge-only", extra_flags=("--vlora-eager-small-gemm-max-tokens", "0")),
    System("merge_only", "`--plugin vlora --vlora-policy merge-only` (one adapter merged at a time)",
           plugin=True, policy="merge-only"),
    System("vlora_paper", "`--plugin vlora --vlora-admission algorithm1 --vlora-keep-merged majority` "
           "(Algorithm 1's own rules: the others' requests wait until they starve, and a merged adapter "
           "unmerges as soon as line 5 fails)",
           plugin=True, extra_flags=("--vlora-admission", "algorithm1", "--vlora-keep-merged", "majority")),
    System("vlora_admit_all", "`--plugin vlora --vlora-admission all --vlora-keep-merged majority` (while an "
           "adapter is merged, the others' requests are admitted at once, in mixture; it unmerges as soon "
           "as line 5 fails)",
           plugin=True, extra_flags=("--vlora-admission", "all", "--vlora-keep-merged", "majority")),
    System("vlora_plurality", "`--plugin vlora --vlora-admission all --vlora-keep-merged plurality` (our "
           "defaults spelled out: stays merged while the merged adapter is the most requested; the others "
           "admitted at once, in mixture)",
           plugin=True, extra_flags=("--vlora-admission", "all", "--vlora-keep-merged", "plurality")),
    System("vlora_keep_popular", "`--plugin vlora --vlora-keep-merged popular` (our defaults, except that a "
           "merged adapter also stays while it has more than half of the recent arrivals; the others' requests "
           "run in mixture around it)", plugin=True, extra_flags=("--vlora-keep-merged", "popular")),
    System("vlora_popular_40", "`--plugin vlora --vlora-keep-merged popular --vlora-popular-share 0.4` (a "
           "merged adapter kept while it has more than 0.4 of the last 32 arrivals, and entering a merge "
           "needs only that share)", plugin=True,
           extra_flags=("--vlora-keep-merged", "popular", "--vlora-popular-share", "0.4")),
    System("vlora_popular_64_40", "`--plugin vlora --vlora-keep-merged popular --vlora-popular-share 0.4 "
           "--vlora-popular-window 64` (as vlora_popular_40 over the last 64 arrivals: the gate passes Zipf 2's "
           "top adapter 98.5% of the time and one of 4 uniform adapters at most 1.7%)", plugin=True,
           extra_flags=("--vlora-keep-merged", "popular", "--vlora-popular-share", "0.4",
                        "--vlora-popular-window", "64")),
    System("dlora_like", "`--plugin vlora --vlora-policy dlora` (merge the dominant adapter or unmerge "
           "all; no mixture)", plugin=True, policy="dlora"),
)}
FLOOR = "nolora"
NO_CUDA_REASON = (
    "needs a CUDA GPU: plain SGLang (no --plugin vlora) does not start on a CPU-only machine "
    "('No accelerator ... is available'), and its triton / csgmv LoRA kernels are Triton GPU kernels"
)


def startable(systems: Sequence[str], has_gpu: bool, force: bool = False) -> list[str]:
    """The systems of a call whose servers are started: one that needs CUDA only where there is
    a GPU (or with ``--force``); the others are recorded as skipped (:data:`NO_CUDA_REASON`)."""
    return [name for name in systems if has_gpu or force or not SYSTEMS[name].needs_cuda]


@dataclass(frozen=True)
class Point:
    """One workload at one load. ``client``: ``sglang`` (SGLang's own serving benchmark,
    random-ids text of ``input_len`` / ``output_len`` tokens, adapters by ``distribution``:
    ``skewed`` = its Zipf-like law with ``zipf_alpha``, or ``uniform``), ``retrieval`` or
    ``video`` (:mod:`bench.client`; adapters by :func:`bench.workloads.popularity` with
    ``top_share`` and ``alpha``). Arrivals stop at ``requests`` or ``max_duration_s``."""

    id: str
    client: str
    label: str
    rate: float
    requests: int
    max_duration_s: float = 120.0
    input_len: int = 0
    output_len: int = 0
    distribution: str = "skewed"
    zipf_alpha: float = 2.0
    top_share: float = 0.8
    alpha: float = 1.0
    image_sizes: tuple[int, ...] = workloads.IMAGE_SIZES
    frame_size: int = workloads.FRAME_SIZE
    streams: int = 2
    detection_stride: int = 10
    chunk_s: float = 1.0  # video: seconds between a stream's 30-frame chunks
    heads: bool = False
    output_cap: int | None = None
    only: tuple[str, ...] = ()  # systems that run it (empty: every system of the call)

    def __post_init__(self) -> None:
        if self.client not in ("sglang", "retrieval", "video"):
            raise ValueError(f"point {self.id}: client must be sglang, retrieval or video, got {self.client!r}")
        if self.rate <= 0 or self.requests < 1 or self.chunk_s <= 0:
            raise ValueError(f"point {self.id}: rate, requests and chunk_s must be > 0")
        if self.client == "sglang" and (self.input_len < 1 or self.output_len < 1):
            raise ValueError(f"point {self.id}: an sglang point needs input_len and output_len >= 1")
        if self.distribution not in ("skewed", "uniform"):
            raise ValueError(f"point {self.id}: distribution must be skewed or uniform")

    @property
    def arrivals_s(self) -> float:
        """Expected seconds of arrivals."""
        return min(self.max_duration_s, self.requests / self.rate)

    def runs_on(self, system: str) -> bool:
        return not self.only or system in self.only


def _sglang(pid: str, label: str, n_in: int, n_out: int, dist: str = "skewed", **kw) -> Point:
    return Point(pid, "sglang", label, rate=8.0, requests=400, input_len=n_in, output_len=n_out,
                 distribution=dist, **kw)


# The workloads: 8 req/s, 400 requests (50 s of arrivals), 4 rank-64 q/k/v/o adapters.
GPU_POINTS = {p.id: p for p in (
    _sglang("sgl-prefill", "random-ids 1024 in / 1 out, Zipf 2", 1024, 1),
    _sglang("sgl-decode", "random-ids 16 in / 64 out, Zipf 2", 16, 64),
    _sglang("sgl-mixed", "random-ids 1024 in / 64 out, Zipf 2", 1024, 64),
    _sglang("sgl-mixed-uniform", "random-ids 1024 in / 64 out, uniform", 1024, 64, dist="uniform"),
    # SGLang's skewed law gives adapter i a weight of alpha**-i: at 2 the top adapter of 4 has
    # 8/15 = 0.53 of the requests, under the 0.6-0.9 the skewed targets name; at 4 it has 64/85 = 0.75.
    _sglang("sgl-mixed-share75", "random-ids 1024 in / 64 out, skewed 4 (top adapter 75%)", 1024, 64,
            zipf_alpha=4.0),
    # Vision-sized points load the server to about half of what it sustained on the H200
    # (2026-11-23, bench/results/e2e/earlier/e2e_issue13_vision_sized.json: about 8 frames of
    # 448 px a second, image preprocessing and the ViT included; at 8 requests/s the video
    # points queued for a minute). A retrieval request is 1-2.25 such frames; one video stream
    # at stride 30 with a chunk every 2 s is 3.5 frames a second.
    Point("vision-skewed", "retrieval", "retrieval, 448/672 px images, top adapter 80%", rate=2.5,
          requests=150, top_share=0.8),
    Point("vision-uniform", "retrieval", "retrieval, 448/672 px images, uniform", rate=2.5, requests=150,
          top_share=0.25, alpha=0.0),
    Point("video-lm", "video", "video, 1 stream, 6-frame understanding by LM decoding", rate=1.0,
          requests=60, streams=1, detection_stride=30, chunk_s=2.0,
          only=("vlora", "csgmv")),  # the heads' comparison: ours and SGLang's default
    Point("video-heads", "video", "video, 1 stream, 6-frame understanding by task heads", rate=1.0,
          requests=60, streams=1, detection_stride=30, chunk_s=2.0, heads=True, only=("vlora",)),
)}
# CPU: the tiny model, small images, short outputs; checks the harness, measures nothing.
CPU_POINTS = {p.id: p for p in (
    Point("sgl-mixed", "sglang", "random-ids 64 in / 4 out, Zipf 2", rate=8.0, requests=16, input_len=64,
          output_len=4),
    Point("vision-skewed", "retrieval", "retrieval, 56/112 px images, top adapter 80%", rate=8.0, requests=12,
          image_sizes=(56, 112), output_cap=4),
    Point("video-lm", "video", "video, 1 stream, LM decoding", rate=3.0, requests=8, frame_size=56, streams=1,
          detection_stride=15, output_cap=4),
    Point("video-heads", "video", "video, 1 stream, task heads", rate=3.0, requests=8, frame_size=56, streams=1,
          detection_stride=15, output_cap=4, heads=True, only=("vlora",)),
)}


@dataclass(frozen=True)
class Call:
    """What one command runs: ``systems`` side by side, ``points`` x ``repeats``."""

    name: str
    scale: str  # gpu | cpu
    systems: tuple[str, ...]
    points: tuple[str, ...]
    repeats: int = 2
    why: str = ""
    scale_requests: float = 1.0  # shorter points (make bench's short run)
    # Server flags of this call on top of the setup's. They are recorded with the run's
    # ``--server-args`` (``extra_server_args``), so the report keys its points by them and
    # never pools them with runs of the same point made without.
    server_args: tuple[str, ...] = ()


# The vision encoder's attention for calls with images. SGLang's `sdpa` backend builds a dense
# block mask on the host and copies it from pageable memory: on the H200 one 6-frame
# understanding request's prefill spent 116 ms in that copy and 75 ms in a masked attention
# kernel, 300 ms in all against 105 ms with `triton_attn` (bench/results/video_timeline_h200.json).
# Production installs on Hopper use `fa3`, which this environment lacks; `triton_attn` is the
# nearest it has. `cuda_ipc` hands the processed pixels to the scheduler through GPU memory
# instead of pickling them: one 6-frame request's preprocess went from 31 to 17 ms and its
# hand-over from 30 to 5 ms (bench/results/video_timeline_ipc_h200.json). Both flags change
# what every system of a call does alike; neither touches LoRA.
VISION_FLAGS = ("--mm-attention-backend", "triton_attn", "--mm-feature-transport", "cuda_ipc")

CALLS = {c.name: c for c in (
    Call("mixed-skewed", "gpu", ("nolora", "vlora", "csgmv"), ("sgl-mixed",),
         why="headline: ours vs SGLang's default and the floor, 1024/64, Zipf 2"),
    # The headline workload in shorter rounds: between two repeats of one call ours' LoRA cost
    # moved from -2 to +296 ms, and so did the time of its prefills without LoRA work
    # (docs/orchestrator.md). Six rounds of 100 requests a system, the systems taking turns (each
    # first twice), spread a slow minute over all of them; 600 requests a system in one call.
    # Its points are reported apart from the 400-request ones.
    Call("mixed-skewed-blocks", "gpu", ("nolora", "vlora", "csgmv"), ("sgl-mixed",), repeats=6,
         scale_requests=0.25, why="the headline workload in 6 rounds of 100 requests a system, taking turns"),
    # The same with a second, identical floor server: how far apart the harness reads two
    # identical systems round by round, next to the gap it is asked to show (report: the twin's
    # mean E2E over the floor's, with its interval). Five rounds: a round of four systems takes
    # about 70 s on the H200, and a sixth never fitted the budget after the servers' start.
    Call("mixed-skewed-blocks-twin", "gpu", ("nolora", "nolora_twin", "vlora", "csgmv"), ("sgl-mixed",),
         repeats=5, scale_requests=0.25,
         why="mixed-skewed-blocks with the floor twice: the harness's resolution (A/A) beside the gap it measures"),
    # The same rounds with the top adapter at 0.75 of the requests: inside the skewed targets'
    # 0.6-0.9, through SGLang's own client (at 2 a round's top share ran 0.48 to 0.63).
    Call("mixed-share75-blocks", "gpu", ("nolora", "vlora", "csgmv", "triton"), ("sgl-mixed-share75",),
         repeats=5, scale_requests=0.25,
         why="the headline workload with the top adapter at 75% (SGLang's skewed law at 4), 5 rounds of 100"),
    Call("vision-skewed", "gpu", ("nolora", "vlora", "csgmv"), ("vision-skewed",),
         why="vision-sized retrieval (256-576 visual tokens), top adapter 80%", server_args=VISION_FLAGS),
    # The same in six rounds of 38 requests (15 s of arrivals) a system, taking turns: ours' LoRA
    # cost at this point is tens of ms on a floor that moved by more than that between the two
    # repeats of one call (docs/bench.md).
    Call("vision-skewed-blocks", "gpu", ("nolora", "vlora", "csgmv"), ("vision-skewed",), repeats=6,
         scale_requests=0.25, why="vision-skewed in 6 rounds of 38 requests a system, taking turns",
         server_args=VISION_FLAGS),
    Call("uniform", "gpu", ("vlora", "unmerge_only", "csgmv"), ("sgl-mixed-uniform",),
         why="uniform popularity: ours within the spread of unmerge-only, never behind csgmv"),
    Call("video", "gpu", ("vlora", "csgmv"), ("video-lm", "video-heads"),
         why="video understanding on 6 frames: task heads vs LM decoding", server_args=VISION_FLAGS),
    Call("peers", "gpu", ("nolora", "triton", "unmerge_only"), ("sgl-mixed",),
         why="SGLang's triton backend and ATMM alone on the headline workload"),
    Call("policies", "gpu", ("nolora", "merge_only", "dlora_like", "vlora_paper"), ("sgl-mixed",),
         why="the comparison policies on the headline workload"),
    Call("prefill", "gpu", ("nolora", "vlora", "csgmv"), ("sgl-prefill",), why="1024 in / 1 out"),
    Call("decode", "gpu", ("nolora", "vlora", "csgmv"), ("sgl-decode",), why="16 in / 64 out"),
    # The in-server speed issue's two workloads, ATMM alone, in rounds taking turns. Measured one
    # system at a time, the same server's eager prefills of new requests took a median of 47 to
    # 76 ms from one 50-s measurement to the next while its decode steps did not move, and its
    # LoRA cost followed (bench/results/timeline_decode_5e23df8_h200.json): shorter rounds spread
    # such minutes over every system, as they did for the headline workload. Five rounds, as for the
    # other calls of four systems.
    Call("prefill-blocks", "gpu", ("nolora", "unmerge_only", "csgmv", "triton"), ("sgl-prefill",), repeats=5,
         scale_requests=0.25, why="1024 in / 1 out, ATMM alone, in 5 rounds of 100 requests a system, taking turns"),
    Call("decode-blocks", "gpu", ("nolora", "unmerge_only", "csgmv", "triton"), ("sgl-decode",), repeats=5,
         scale_requests=0.25, why="16 in / 64 out, ATMM alone, in 5 rounds of 100 requests a system, taking turns"),
    Call("vision-uniform", "gpu", ("vlora", "unmerge_only", "csgmv"), ("vision-uniform",),
         why="vision-sized retrieval, uniform popularity", server_args=VISION_FLAGS),
    Call("short", "gpu", ("nolora", "vlora", "csgmv"), ("sgl-mixed", "vision-skewed"), repeats=1,
         scale_requests=0.25, why="make bench on a GPU: every client, a quarter of the requests, once",
         server_args=VISION_FLAGS),
    Call("cpu-smoke", "cpu", ("nolora", "vlora", "unmerge_only", "csgmv"),
         ("sgl-mixed", "vision-skewed", "video-lm", "video-heads"),
         why="make bench without a GPU and the CI test: the harness end to end on the tiny model"),
)}
# The order in which the full benchmark's calls matter; run each twice for four repeats.
FULL = ("mixed-skewed", "vision-skewed", "uniform", "video", "peers", "policies", "prefill", "decode",
        "vision-uniform")


def points_of(scale: str) -> dict[str, Point]:
    if scale not in ("gpu", "cpu"):
        raise ValueError(f"scale must be gpu or cpu, got {scale!r}")
    return GPU_POINTS if scale == "gpu" else CPU_POINTS


@dataclass(frozen=True)
class Measurement:
    system: str
    point: str
    repeat: int


def get_call(name: str, systems: Sequence[str] = (), points: Sequence[str] = (),
             repeats: int | None = None) -> Call:
    """The call ``name`` with optional overrides; unknown names are refused with the choices."""
    if name not in CALLS:
        raise ValueError(f"--call {name!r} is not a call; choose one of {sorted(CALLS)}")
    call = CALLS[name]
    known = points_of(call.scale)
    for s in systems:
        if s not in SYSTEMS:
            raise ValueError(f"--systems: {s!r} is not a system; choose from {sorted(SYSTEMS)}")
    for p in points:
        if p not in known:
            raise ValueError(f"--points: {p!r} is not a {call.scale} point; choose from {sorted(known)}")
    if repeats is not None and repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    return replace(call, systems=tuple(systems) or call.systems, points=tuple(points) or call.points,
                   repeats=repeats or call.repeats)


def _flag_name(arg: str) -> str:
    """``--flag=value`` -> ``--flag``; ``--flag`` stays."""
    return arg.partition("=")[0]


def _flag_groups(args: Sequence[str]) -> list[list[str]]:
    """``["--a", "1", "--b"]`` -> ``[["--a", "1"], ["--b"]]``."""
    groups: list[list[str]] = []
    for arg in args:
        if arg.startswith("--") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return groups


def host_load(call: Call) -> str:
    """``vision`` where any point of ``call`` sends images or video (the servers decode and
    preprocess them on the host's CPUs), else ``text``. Two calls side by side share the host:
    beside a vision call, a text call's unqueued floor prefill moved between 62 and 103 ms from
    round to round, against 58-73 ms beside a text call (docs/bench.md, "What the harness
    resolves")."""
    points = points_of(call.scale)
    return "vision" if any(points[p].client != "sglang" for p in call.points) else "text"


def flag_value(flags: Sequence[str], flag: str) -> str | None:
    """The last value given to ``flag`` in server flags (``--flag value`` or ``--flag=value``);
    None if it is absent or has no value."""
    value = None
    for group in _flag_groups(flags):
        name, equals, inline = group[0].partition("=")
        if name == flag:
            value = inline if equals else (group[1] if len(group) > 1 else None)
    return value


def server_args(call: Call, user: Sequence[str]) -> list[str]:
    """The extra server flags of a run: the user's ``--server-args``, then the call's own
    flags that the user did not set (a user's flag wins)."""
    given = {_flag_name(g[0]) for g in _flag_groups(user)}  # --flag value or --flag=value
    return [*user, *(a for g in _flag_groups(call.server_args) if _flag_name(g[0]) not in given for a in g)]


def trace_seed(seed: int, repeat: int) -> int:
    """The client seed of round ``repeat`` of a call run with ``--seed seed``: its requests
    (arrivals, prompts, adapters), the same for every system of the round. Calls whose seeds
    lie within their rounds of each other therefore send some of the same traces."""
    return seed + repeat


def scaled(point: Point, factor: float) -> Point:
    """``point`` with ``factor`` times its requests (at least 8)."""
    if factor == 1.0:
        return point
    return replace(point, requests=max(8, round(point.requests * factor)))


def order(call: Call, runnable: Sequence[str]) -> list[Measurement]:
    """Every measurement of ``call`` on the ``runnable`` systems: repeat by repeat, point by
    point, the systems rotated by one place per repeat (so no system is always first after
    the previous one's load)."""
    systems = [s for s in call.systems if s in runnable]
    out = []
    for r in range(call.repeats):
        turn = systems[r % len(systems):] + systems[: r % len(systems)] if systems else []
        for pid in call.points:
            point = points_of(call.scale)[pid]
            out += [Measurement(s, pid, r) for s in turn if point.runs_on(s)]
    return out


@dataclass(frozen=True)
class Setup:
    """Model, adapters and the flags every server of a scale gets."""

    scale: str
    adapters: int
    ranks: tuple[int, ...]
    common_flags: tuple[str, ...] = ()
    lora_flags: tuple[str, ...] = ()
    start_timeout_s: float = 600.0
    caveats: tuple[str, ...] = ()


GPU_SETUP = Setup(
    "gpu", adapters=4, ranks=(64,),
    common_flags=("--load-format", "dummy", "--dtype", "bfloat16", "--attention-backend", "triton",
                  "--sampling-backend", "pytorch", "--mm-attention-backend", "sdpa",
                  "--max-total-tokens", "65536", "--sleep-on-idle"),
    lora_flags=("--max-lora-rank", "64", "--max-loras-per-batch", "4"),
    start_timeout_s=420.0,
    caveats=(
        "Model: Qwen2-VL-7B's shape (28 layers, hidden 3584, 32-layer ViT) with --load-format dummy: random "
        "weights, so answers are meaningless; ignore_eos fixes every request's output length. The tokenizer is "
        "the tiny model's (prompt token counts differ from Qwen2's tokenizer; random-ids prompts are exact).",
        "Adapters: 4, rank 64 on q/k/v/o of every layer, bf16, random values; each carries a random "
        "video-understanding head.",
        "Not a production install (SGLang 0.5.23 run from its Python package on the device's torch): "
        "SGLANG_FORCE_FUSED_OP_BACKEND=torch runs norms, activations and rotary as plain torch ops and a "
        "stand-in sgl_kernel replaces sglang-kernel, so the base model is slower than in production and "
        "LoRA's share of the time looks smaller. Compare systems with each other; quote absolute latencies "
        "only with this caveat.",
        "The servers of one call share the GPU (each holds its weights, a 65536-token KV cache and its "
        "CUDA graphs); only the one being measured gets requests, the others sleep (--sleep-on-idle).",
    ),
)
CPU_SETUP = Setup(
    "cpu", adapters=4, ranks=(8, 16), common_flags=("--dtype", "float32"),
    lora_flags=("--max-lora-rank", "16", "--max-loras-per-batch", "4"),
    caveats=("CPU scale: a tiny random-weight Qwen2-VL on CPU with the torch reference paths. It checks the "
             "harness end to end; its numbers say nothing about GPU serving.",),
)


def setup_of(scale: str) -> Setup:
    points_of(scale)
    return GPU_SETUP if scale == "gpu" else CPU_SETUP
