"""The ``atmm`` SGLang LoRA backend: batch info -> work items -> ATMM.

SGLang's LoRA manager hands the backend, before each forward, the memory-pool slot
of every request and the rank and scaling of every slot. This backend turns that
into :class:`~sglang_vlora.atmm.work_items.WorkItems` with
:func:`sglang_vlora.modes.delora.mode_work_items` (one item per run of consecutive
requests on the same adapter, ``scale = +scaling``; the no-adapter slot has rank 0
and produces no item; with an adapter merged into the weights, the mixture items)
and runs every LoRA-wrapped layer through :mod:`sglang_vlora.atmm.ops`.

Two batch layouts, one item builder:

* eager (prefill, decode without graphs): the items written from the host into static
  buffers allocated once (one set for batches with an adapter merged, whose mixture items
  come in pairs, one for the others), and every layer run by launch plans kept across batches,
  per module shape and token bound (``ops.lora_apply_kept``; their grids sized for the bound):
  an eager forward is bound by the host's kernel launches (docs/perf.md), and building a
  batch's plans anew cost as much host time as its steady LoRA calls. On the layers whose base
  weight carries the pool's A rows (:mod:`sglang_vlora.in_gemm_weights`), eager batches of at
  most ``--vlora-eager-in-gemm-max-tokens`` tokens compute the shrink inside the base GEMM as
  graph batches do (with kept plans, each layer's ``ops.KeptInGemmCall``, kept for the batch's
  token bound): one launch a module where the separate shrink takes two. Unmerged eager batches
  of at most ``--vlora-eager-small-gemm-max-tokens`` tokens (a new request's prefill beside a
  decoding batch) run each such module as one kernel instead, base GEMM, shrink and expand
  (``ops.KeptSmallGemmCall``): no torch GEMM call, whose host time is more than a direct
  launch's, and one launch a module. The items as device
  :class:`WorkItems`, whose grids come from their host copies, are built only where a call
  needs them: SGLang's own LoRA path, a shape the table gives cuBLAS or the CUDA kernel,
  ``--vlora-atmm-impl`` other than auto/triton (or auto on a CPU, which runs the reference),
  or ``--vlora-lora-gemm on``.
* CUDA graph (decode, and prefill where SGLang captures prefill graphs): the same items
  written by :meth:`~sglang_vlora.atmm.static_items.StaticWorkItems.fill` into buffers
  allocated once per graph family (capacity: the most items any mode gives for the
  family's largest batch, two overlap layers of shrink rows for mixture items, whose
  pairs the expand runs in one launch), run by the graph-safe ``ops.*_static`` calls,
  whose grids come from those static bounds only. SGLang prepares every batch before
  replaying a graph (and prepares the capture batch, all base-only, before
  capturing), so a graph captured with no items replays right with any adapter mix,
  in any mode. In decode graphs, and prefill graphs of up to
  :data:`SIDE_STREAM_MAX_TOKENS` tokens, base + LoRA layers overlap the shrink with the
  base GEMM on a side stream (``ops.lora_apply_static_with_base``); larger prefill graphs
  run them in sequence: their base GEMM fills every SM, so a shrink beside it only
  waited for free SMs (docs/perf.md, "The shrink in sequence in prefill graphs").
  Prefill graphs matter most where the
  eager forward is bound by the host's launches: a replay launches the whole captured
  forward, LoRA kernels included, at once (docs/perf.md).

SGLang only calls this module; it imports SGLang because it subclasses
``BaseLoRABackend`` (registered by :mod:`sglang_vlora.plugin`, whose factory hands each
backend the scheduler process's :class:`~sglang_vlora.runtime.VLoRARuntime`: the options and
the mode controller).
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch
from sglang.srt.lora.backend.base_backend import BaseLoRABackend
from sglang.srt.lora.utils import LoRABatchInfo, generate_sequence_lengths

from sglang_vlora import in_gemm_weights
from sglang_vlora.atmm import gemm_lora, ops, small_gemm
from sglang_vlora.atmm.static_items import StaticWorkItems
from sglang_vlora.atmm.work_items import WorkItems, build_work_items, packed_to_device
from sglang_vlora.config import NEVER_MERGES, VLoRAConfig
from sglang_vlora.modes.delora import MAX_MODE_LAYERS, max_mode_items, mode_work_items
from sglang_vlora.runtime import VLoRARuntime

logger = logging.getLogger(__name__)

# Modules whose LoRA runs through SGLang's embedding / lm_head paths, which this
# backend does not implement.
UNSUPPORTED_TARGETS = frozenset({"embed_tokens", "lm_head"})
# Prefill graphs of up to this many tokens overlap the shrink with the base GEMM on the side
# stream, as decode graphs do; larger ones run it in sequence. On the H200, 28 layers of
# Qwen2-VL-7B's q/k/v and o in a CUDA graph (bench/results/graph_step_h200.json): beside the
# GEMM the LoRA added 0.08-0.29 ms less than in sequence at 16-256 tokens, 0.14-0.22 ms more
# at 512 and 1024. Decided by the rows a layer runs, i.e. the graph's captured size.
SIDE_STREAM_MAX_TOKENS = 256
# Eager batches' LoRA inside ATMM's own GEMM (ops.lora_apply_gemm) for pools of at most this max
# rank: faster than the eager shrink and expand in every prefill cell of ranks 8-64 of the H200
# kernel runs, slower at 128 (docs/atmm.md).
LORA_GEMM_MAX_RANK = 64
# Launch plans kept across eager batches (by module shape and token bound, ops.kept_plan_tokens);
# past this many the cache starts over.
EAGER_PLANS = 256
# Profiler ranges around batch preparation and the eager LoRA calls (docs/perf.md), off unless
# asked for: a range costs host time on every call even when no profiler runs.
_profile_range = (
    torch.profiler.record_function if os.environ.get("SGLANG_VLORA_PROFILE_RANGES") == "1"
    else lambda _name: contextlib.nullcontext()
)


def segments_from_requests(
    seq_lens: list[int], weight_indices: list[int]
) -> tuple[list[int], list[int], list[int]]:
    """Group consecutive requests on the same slot: (starts, lengths, slots)."""
    starts: list[int] = []
    lengths: list[int] = []
    slots: list[int] = []
    offset = 0
    for seq_len, slot in zip(seq_lens, weight_indices, strict=True):
        if slots and slots[-1] == slot:
            lengths[-1] += seq_len
        else:
            starts.append(offset)
            lengths.append(seq_len)
            slots.append(slot)
        offset += seq_len
    return starts, lengths, slots


def group_by_slot(
    seq_lens: list[int], weight_indices: list[int]
) -> tuple[list[int], list[int], list[int], list[int] | None]:
    """Segments with one run per slot: ``(starts, lengths, slots, permutation)``.

    Requests of one adapter that are not next to each other would each be a segment, and
    every segment's kernel tile reads the adapter's weights again (a decode batch of 32
    requests over 4 adapters: 32 reads of each weight instead of 4). When some slot has
    several runs, the requests are stably sorted by slot and ``permutation`` lists the
    token of each sorted position; else the tokens keep their order (None)."""
    starts, lengths, slots = segments_from_requests(seq_lens, weight_indices)
    if len(set(slots)) == len(slots):
        return starts, lengths, slots, None
    offsets = [0]
    for seq_len in seq_lens:
        offsets.append(offsets[-1] + seq_len)
    order = sorted(range(len(seq_lens)), key=weight_indices.__getitem__)
    permutation = [t for i in order for t in range(offsets[i], offsets[i + 1])]
    starts, lengths, slots = segments_from_requests([seq_lens[i] for i in order], [weight_indices[i] for i in order])
    return starts, lengths, slots, permutation


class ATMMLoRABackend(BaseLoRABackend):
    """LoRA over work items; kernels chosen by :mod:`sglang_vlora.atmm.ops`."""

    name = "atmm"
    # A batch with no work items (every token the merged adapter's or the base model's) has no
    # active LoRA (mode_hooks.no_work_no_lora_after): SGLang's layers then run the base alone,
    # and its decode runner captures a base-only graph beside the LoRA one to replay for it.
    skip_inactive_dense_lora = True
    # Prefill graphs: the static items of init_prefill_cuda_graph_batch_info, filled per batch.
    supports_prefill_cuda_graph = True

    def __init__(
        self,
        max_loras_per_batch: int,
        device: torch.device,
        impl: str | None = None,
        runtime: VLoRARuntime | None = None,
        **kwargs,
    ):
        super().__init__(max_loras_per_batch, device)
        # None: a backend built outside a server (tests, benchmarks): defaults, nothing merged.
        self.runtime = runtime
        cfg = runtime.config if runtime is not None else None
        if impl is None:
            impl = cfg.atmm_impl if cfg is not None else "auto"
        self.impl = impl
        # Overlapping items (two layers of shrink rows) come only from a merged adapter; they
        # are pairs (modes/delora.py), so every graph batch runs one expand launch a module.
        self.graph_layers = 1 if cfg is not None and cfg.policy == NEVER_MERGES else MAX_MODE_LAYERS
        self.work_items = None  # through its setter: see the property
        self.graph_items: StaticWorkItems | None = None  # decode graphs
        self.prefill_graph_items: StaticWorkItems | None = None  # prefill graphs
        self.cuda_graph_batch_info: LoRABatchInfo | None = None  # SGLang's view of decode graph batches
        # The static items the prepared batch was written into (one of the two above) when
        # it runs through the graph-safe ops; None for an eager batch.
        self.static_items: StaticWorkItems | None = None
        # Graph batches' shrinks beside the base GEMM (CUDA only); prefill graphs of more than
        # SIDE_STREAM_MAX_TOKENS rows run in sequence instead (forward_with_base).
        self.side_stream: torch.cuda.Stream | None = None
        # Whether some layers compute graph batches' shrink inside the base GEMM (set when the
        # LoRA manager is built, before graphs: sglang_vlora.in_gemm_weights): the static items
        # then cover every token (copy items), as that expand writes a separate output.
        self.shrink_in_gemm = False
        self.use_graph_path = False
        self.has_lora_work = False  # whether the prepared batch has any work item
        # Batches prepared without any work item, by layout, since start-up (graph capture's
        # base-only batches included): /vlora/status shows them (ModeController.status).
        self.batches_without_work = {"eager": 0, "graph": 0}
        # Whether SGLang's decode graph runner has a base-only graph, which it replays for a
        # batch without LoRA work (modes/mode_hooks.lora_graph_if_work_around sets it at every
        # replay): then such a batch's items are never read, and a decode batch wholly of the
        # merged adapter's requests skips building and writing them.
        self.base_only_decode_graph = False
        # Module shapes run inside a graph capture whose eager kernels are not compiled yet:
        # compiled at the next batch prepared outside a capture (SGLang's warm-up request).
        self._eager_compiles_due: dict[tuple, tuple] = {}
        self._eager_compiles_done: set[tuple] = set()
        # Batches prepared, by the layout they were written for (a graph batch is replayed
        # unless SGLang's runner then runs it eagerly, e.g. a prefill with images in it).
        self.batches_by_layout = {"eager": 0, "decode_graph": 0, "prefill_graph": 0, "eager_lora_gemm": 0,
                                  "eager_in_gemm": 0, "eager_kept": 0, "eager_small_gemm": 0}
        # Eager batches of at most this many tokens compute the shrink inside the base GEMM too, on
        # the layers with the appended rows (one launch a module fewer); their items go into
        # static buffers allocated once, so the prepared expand launches serve every later batch.
        self.eager_in_gemm_max_tokens = (cfg.eager_in_gemm_max_tokens if cfg is not None
                                         else VLoRAConfig.eager_in_gemm_max_tokens)
        # The static items the prepared eager batch was written into: one of _eager_buffers, by
        # whether the batch may hold mixture's pairs (an adapter merged) or not.
        self.eager_static: StaticWorkItems | None = None
        self._eager_buffers: dict[bool, StaticWorkItems] = {}
        self.eager_in_gemm = False  # whether the prepared batch runs it
        # With kept plans, each layer's in-GEMM call (ops.KeptInGemmCall) for the prepared batch's
        # token bound (ops.kept_plan_tokens), by id(layer): rebuilt where the bound or the buffers
        # differ from the call's.
        self._in_gemm_calls: dict[int, ops.KeptInGemmCall] = {}
        # Unmerged eager batches of at most this many tokens that run the in-GEMM calls run each
        # such module as one kernel instead (base GEMM, shrink and expand: ops.KeptSmallGemmCall,
        # kept per layer like the in-GEMM calls): no torch GEMM call, one launch a module.
        self.eager_small_gemm_max_tokens = (cfg.eager_small_gemm_max_tokens if cfg is not None
                                            else VLoRAConfig.eager_small_gemm_max_tokens)
        self._small_gemm_calls: dict[int, ops.KeptSmallGemmCall] = {}
        # Per layer (by id), why the one kernel cannot run it (None: it can); decided once, a
        # reason logged once. Such a layer keeps the in-GEMM call.
        self._small_gemm_reasons: dict[int, str | None] = {}
        self.eager_small_gemm = False  # whether the prepared batch runs them
        self._eager_bound = 0
        self.eager_in_gemm_kept = False  # whether the prepared batch runs them (Triton's kernels do)
        # Whether eager batches' items go into the static buffers (eager_static) for every layer,
        # run by launch plans kept across batches (ops.lora_apply_kept; the in-GEMM layers' too):
        # where the Triton kernels run them (impl "auto" on a GPU, or "triton"). Else each batch
        # builds its device items and prepares its launches anew (ops.lora_apply).
        self.kept_plans = impl == "triton" or (impl == "auto" and torch.device(device).type == "cuda")
        # Where Triton's kernels run at all: on a GPU; on a CPU only under Triton's interpreter,
        # where the Triton paths run for tests (elsewhere a CPU runs the torch reference).
        self.triton_runs = torch.device(device).type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
        self.eager_kept = False  # whether the prepared batch runs them
        self._eager_plans: dict[tuple, object] = {}
        # An eager batch's items in the tokens' order (no permutation) for ops.lora_apply_gemm, on
        # the layers with the appended-rows stack; None where that op does not run (--vlora-lora-gemm).
        self.gemm_items: WorkItems | None = None
        self.lora_gemm = cfg is not None and cfg.lora_gemm == "on" and self.triton_runs
        self.lora_gemm_min_tokens = cfg.lora_gemm_min_tokens if cfg is not None else 0
        # Per module shape, why the op cannot run it (None: it can); decided once, logged once.
        self._lora_gemm_reasons: dict[tuple, str | None] = {}
        self._lora_gemm_ran = False  # whether the prepared batch ran some module through it

    # ------------------------------------------------------------------ set-up
    def validate_lora_targets(self, base_model: torch.nn.Module, target_modules: set[str]) -> None:
        bad = sorted(set(target_modules) & UNSUPPORTED_TARGETS)
        if bad:
            raise ValueError(
                f"LoRA backend 'atmm' does not support LoRA on {bad}; "
                "use --lora-backend triton for adapters that train embeddings or lm_head."
            )

    def init_decode_cuda_graph_batch_info(self, max_bs_in_cuda_graph: int, num_tokens_per_req: int):
        """Called once by SGLang's decode graph runner, before any capture."""
        self.graph_items = self._allocate_static(max_bs_in_cuda_graph, max_bs_in_cuda_graph * num_tokens_per_req)
        self._create_side_stream()
        self.cuda_graph_batch_info = self._static_batch_info(max_bs_in_cuda_graph, num_tokens_per_req)

    def init_prefill_cuda_graph_batch_info(self, max_num_tokens: int, max_num_requests: int | None = None):
        """Called once by SGLang's prefill graph runner, before any capture: static items for
        prefill batches of up to ``max_num_requests`` requests and ``max_num_tokens`` tokens
        (SGLang serves larger batches eagerly)."""
        max_requests = max_num_tokens if max_num_requests is None else max_num_requests
        self.prefill_graph_items = self._allocate_static(max_requests, max_num_tokens)
        self.prefill_cuda_graph_batch_info = self._static_batch_info(max_requests, max_num_tokens)
        self.prefill_cuda_graph_max_bs = max_requests
        self.prefill_cuda_graph_max_tokens = max_num_tokens
        self._create_side_stream()

    def _create_side_stream(self) -> None:
        """The graph batches' side stream, made before any capture (never inside one)."""
        if self.side_stream is None and torch.device(self.device).type == "cuda":
            self.side_stream = torch.cuda.Stream(device=self.device)

    def _allocate_static(self, max_requests: int, max_tokens: int, layers: int | None = None) -> StaticWorkItems:
        """``layers``: overlap layers of items (default: the graphs', ``graph_layers``); more
        than one means mixture's pairs."""
        # Segments are grouped by slot (group_by_slot): at most one per pool slot, so the
        # items (and the kernels' grids) are bounded by the slots, not the batch size.
        layers = self.graph_layers if layers is None else layers
        return StaticWorkItems.allocate(
            capacity=max_mode_items(min(max_requests, self.max_loras_per_batch)),
            max_tokens=max_tokens,
            num_slots=self.max_loras_per_batch,
            device=self.device,
            max_layers=layers,
            paired=layers > 1,
            covers_tokens=self.shrink_in_gemm,
        )

    def _static_batch_info(self, max_requests: int, tokens_per_request: int) -> LoRABatchInfo:
        """SGLang's view of a graph family's batches: it reads only the batch size, segment
        count and ``has_active_lora`` (this backend's kernels read the static items)."""
        with torch.device(self.device):
            return LoRABatchInfo(
                use_cuda_graph=True,
                bs=max_requests,
                num_segments=max_requests,
                seg_indptr=torch.zeros(max_requests + 1, dtype=torch.int32),
                weight_indices=torch.zeros(max_requests, dtype=torch.int32),
                lora_ranks=torch.zeros(self.max_loras_per_batch, dtype=torch.int32),
                scalings=torch.zeros(self.max_loras_per_batch, dtype=torch.float),
                max_len=tokens_per_request,
                seg_lens=torch.full((max_requests,), tokens_per_request, dtype=torch.int32),
            )

    # ---------------------------------------------------------------- per batch
    def prepare_lora_batch(
        self,
        forward_batch,
        weight_indices: list[int],
        lora_ranks: list[int],
        scalings: list[float],
        use_cuda_graph: bool,
        use_prefill_cuda_graph: bool = False,
    ):
        if self._eager_compiles_due and not _capturing(self.device):
            self._compile_eager_kernels()
        with _profile_range("vlora.prepare_lora_batch"):
            graph = "prefill" if use_prefill_cuda_graph else "decode" if use_cuda_graph else None
            self._prepare(forward_batch, weight_indices, lora_ranks, scalings, graph)

    def _prepare(self, forward_batch, weight_indices, lora_ranks, scalings, graph: str | None) -> None:
        """``graph``: the graph family whose static items the batch is written into
        ("decode" or "prefill"), None for an eager batch."""
        seq_lens = generate_sequence_lengths(forward_batch, device="cpu").tolist()
        starts, lengths, slots, permutation = group_by_slot(seq_lens, list(weight_indices))
        merged_slot = None
        controller = self.runtime.controller if self.runtime is not None else None
        if controller is not None and controller.merged_uid is not None:
            lora_ranks, scalings = list(lora_ranks), list(scalings)
            merged_slot = controller.merged_slot(lora_ranks, scalings)
        # Unmerged: one (+adapter) item per segment. Merged adapter k: mixture items
        # (k's tokens nothing, others +own -k, base-only -k).
        self.batches_by_layout["eager" if graph is None else f"{graph}_graph"] += 1
        if graph is not None:
            self.gemm_items = None
            self.eager_in_gemm = self.eager_kept = self.eager_in_gemm_kept = self.eager_small_gemm = False
            if graph == "prefill":
                static, batch_info = self.prefill_graph_items, self.prefill_cuda_graph_batch_info
            else:
                static, batch_info = self.graph_items, self.cuda_graph_batch_info
            if static is None:
                raise RuntimeError(f"a {graph} graph batch before init_{graph}_cuda_graph_batch_info")
            if (graph == "decode" and self.base_only_decode_graph and merged_slot is not None
                    and all(slot == merged_slot for slot in slots)):
                # Every token is the merged adapter's: no item (modes/delora.py), and the
                # base-only graph that replays reads none, so none is built or written.
                self._count_work(0, "graph")
                self._point_at_graph_batch(forward_batch, static, batch_info)
                return
            items = mode_work_items(starts, lengths, slots, lora_ranks, scalings, merged_slot, device="cpu")
            self._count_work(items.num_items, "graph")
            self._prepare_graph_batch(forward_batch, sum(seq_lens), items, permutation, static, batch_info)
            return
        self.gemm_items = None
        if (self.lora_gemm and self.shrink_in_gemm and merged_slot is None
                and sum(seq_lens) >= self.lora_gemm_min_tokens):
            # Unmerged: one +adapter item per run of requests, in the tokens' order.
            run_starts, run_lengths, run_slots = segments_from_requests(seq_lens, list(weight_indices))
            self.gemm_items = build_work_items(run_starts, run_lengths, run_slots, [scalings[s] for s in run_slots],
                                               lora_ranks, device=self.device)
            self._lora_gemm_ran = False
        self.use_graph_path = False
        self.static_items = None
        num_tokens = sum(seq_lens)
        item_args = (starts, lengths, slots, lora_ranks, scalings, merged_slot)
        in_gemm_fits = self.shrink_in_gemm and num_tokens <= self.eager_in_gemm_max_tokens
        if self.gemm_items is None and (self.kept_plans or in_gemm_fits):
            # The layers read the static buffers: the items go there from the host, and their
            # device copy waits for a call that asks (work_items: SGLang's own LoRA path, or a
            # shape whose table pick is not Triton).
            host_items = mode_work_items(*item_args, device="cpu")
            self._count_work(host_items.num_items, "eager")
            self.eager_in_gemm = self.has_lora_work and in_gemm_fits
            self.eager_in_gemm_kept = self.eager_small_gemm = False
            self.eager_kept = self.has_lora_work and self.kept_plans
            if self.has_lora_work:
                self.eager_static = self._eager_static_items(num_tokens, paired=merged_slot is not None)
                self.eager_static.fill(host_items, num_tokens, permutation, cover_to=num_tokens)
                self._eager_bound = ops.kept_plan_tokens(num_tokens)
                self.eager_in_gemm_kept = self.eager_in_gemm and self.kept_plans and self.triton_runs
                self.eager_small_gemm = (self.eager_in_gemm_kept and merged_slot is None
                                         and num_tokens <= self.eager_small_gemm_max_tokens)
                self.batches_by_layout["eager_in_gemm"] += self.eager_in_gemm
                self.batches_by_layout["eager_small_gemm"] += self.eager_small_gemm
                self.batches_by_layout["eager_kept"] += self.eager_kept
            self._work_items, self._deferred_items = None, (item_args, permutation)
        else:
            self.eager_in_gemm = self.eager_kept = self.eager_in_gemm_kept = self.eager_small_gemm = False
            self.work_items = self._device_items(item_args, permutation)
            self._count_work(self.work_items.num_items, "eager")
        self.batch_info = self._eager_batch_info(forward_batch, seq_lens, weight_indices, lora_ranks, scalings)

    @property
    def work_items(self) -> WorkItems | None:
        """The prepared eager batch's items on the device; None for a graph batch. A batch whose
        items went into the static buffers (kept plans, or the shrink inside the GEMM) builds them
        at the first call that reads them (SGLang's own LoRA path, a shape the table gives another
        implementation than Triton, a layer without the appended rows when plans are not kept),
        not before: the other calls read only the static buffers."""
        if self._deferred_items is not None:
            self._work_items = self._device_items(*self._deferred_items)
            self._deferred_items = None
        return self._work_items

    @work_items.setter
    def work_items(self, items: WorkItems | None) -> None:
        self._work_items, self._deferred_items = items, None

    def _device_items(self, item_args: tuple, permutation: list[int] | None) -> WorkItems:
        perm = None if permutation is None else self._on_device(permutation, torch.int32)
        return mode_work_items(*item_args, device=self.device, permutation=perm)

    def _eager_static_items(self, num_tokens: int, paired: bool) -> StaticWorkItems:
        """The eager batches' static items for at least ``num_tokens`` tokens, ``paired`` for
        batches with an adapter merged (mixture's pairs: two layers of shrink rows, the expand
        reading partners), else one layer of items: that kernel variant is cheaper (the paired
        one took up to 30% more GPU time in the H200's q/k/v cells, docs/perf.md). Allocated at
        the first such batch, for the next power of two of its tokens (at least 1024, and the
        in-GEMM limit), and reallocated only for a larger batch (the kept plans, which hold the
        buffers' addresses, then start over)."""
        paired = paired and self.graph_layers > 1
        static = self._eager_buffers.get(paired)
        if static is None or static.max_tokens < num_tokens:
            max_tokens = max(1024, self.eager_in_gemm_max_tokens, 1 << (num_tokens - 1).bit_length())
            # Items are bounded by the pool's slots (group_by_slot), not the requests.
            if static is not None:
                self._eager_plans.clear()  # they hold the old buffers' addresses
            static = self._eager_buffers[paired] = self._allocate_static(
                self.max_loras_per_batch, max_tokens, layers=self.graph_layers if paired else 1)
        return static

    def _note_captured_shape(self, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, offsets,
                             layer=None) -> None:
        """A module run inside a graph capture: its eager kernels get compiled ahead too. With
        every forward a graph replay, the first eager batch (one above the prefill graph's
        largest bucket, or with images) would otherwise compile them while serving, stalling
        every request in flight for seconds. ``layer``: the module's LoRA layer, whose
        appended-rows stack (with or without bias) the eager LoRA-in-GEMM kernel runs over."""
        if _capturing(x.device):
            fused = getattr(layer, in_gemm_weights.ATTR, None)
            gemm_bias = None if fused is None else fused.bias is not None
            key = (x.dtype, x.shape[1], tuple(lora_a.shape), tuple(lora_b.shape), tuple(int(o) for o in offsets),
                   gemm_bias)
            if key not in self._eager_compiles_done:
                self._eager_compiles_due[key] = (lora_a, lora_b)

    def _compile_eager_kernels(self) -> None:
        """Compile the eager kernels of the captured module shapes, for the pool's largest
        rank (the adapters' ranks are not known at capture), launching nothing. The kernels'
        configs are keyed by rank too: an adapter of a smaller rank still compiles its own at
        its first eager batch, as it does on a server without graphs."""
        for key, (lora_a, lora_b) in self._eager_compiles_due.items():
            dtype, k, _, _, offsets, gemm_bias = key
            num_slices = len(offsets) - 1
            max_rank = lora_a.shape[1] // num_slices
            items = build_work_items([0], [16], [0], [1.0], [max_rank] * lora_a.shape[0], device=self.device)
            x = torch.empty((16, k), dtype=dtype, device=self.device)
            output = torch.empty((16, offsets[-1]), dtype=dtype, device=self.device)
            ops.compile_eager(x, lora_a, lora_b, items, list(offsets), output, self.impl)
            if self.lora_gemm and gemm_bias is not None and lora_b.shape[2] <= LORA_GEMM_MAX_RANK:
                gemm_lora.compile_ahead(x, lora_a, lora_b, list(offsets), gemm_bias)
            in_gemm = gemm_bias is not None and self.eager_in_gemm_max_tokens > 0
            if self.kept_plans or in_gemm:
                # Paired eager buffers exist only where an adapter can be merged.
                for paired in (False, True) if self.graph_layers > 1 else (False,):
                    static = self._eager_static_items(x.shape[0], paired)
                    if self.kept_plans:
                        ops.compile_kept(x, lora_a, lora_b, static, list(offsets), output)
                    if in_gemm:
                        gemm_rows = offsets[-1] + lora_a.shape[0] * lora_a.shape[1]
                        ops.compile_in_gemm(x, gemm_rows, offsets[-1], lora_b, static, list(offsets))
                        if self.kept_plans and not paired and self.eager_small_gemm_max_tokens > 0:
                            ops.compile_small_gemm(x, gemm_rows, gemm_bias, lora_a, lora_b, static, list(offsets))
            self._eager_compiles_done.add(key)
        self._eager_compiles_due.clear()

    def _count_work(self, num_items: int, layout: str) -> None:
        self.has_lora_work = num_items > 0
        if not self.has_lora_work:
            self.batches_without_work[layout] += 1

    def _on_device(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """A host list on the device through pinned memory: the copy does not stall the host."""
        pinned = torch.device(self.device).type == "cuda"
        return torch.tensor(values, dtype=dtype, pin_memory=pinned).to(self.device, non_blocking=True)

    def _eager_batch_info(self, forward_batch, seq_lens, weight_indices, lora_ranks, scalings) -> LoRABatchInfo:
        """SGLang-side view of the batch (read by its layers and MoE/lm_head helpers), its
        tensors from one pinned copy."""
        indptr = [0]
        for seq_len in seq_lens:
            indptr.append(indptr[-1] + seq_len)
        ints = [indptr, list(weight_indices), list(lora_ranks), seq_lens]
        seg_indptr, weights, ranks, seg_lens, scales = packed_to_device(
            ints, [float(s) for s in scalings], self.device
        )
        return LoRABatchInfo(
            use_cuda_graph=False,
            bs=forward_batch.batch_size,
            num_segments=len(seq_lens),
            seg_indptr=seg_indptr,
            weight_indices=weights,
            lora_ranks=ranks,
            scalings=scales,
            max_len=max(seq_lens, default=0),
            seg_lens=seg_lens,
            expected_tokens=indptr[-1],
        )

    def _prepare_graph_batch(
        self, forward_batch, num_tokens: int, items: WorkItems, permutation, static: StaticWorkItems, batch_info
    ) -> None:
        """Write the batch's items into a graph family's buffers, in place (SGLang calls
        this outside capture: before capturing, and before every replay). Only the
        items are written: this backend's graph kernels read nothing else of the batch."""
        if num_tokens > static.max_tokens:
            raise RuntimeError(f"graph batch of {num_tokens} tokens exceeds the captured {static.max_tokens}")
        static.fill(items, num_tokens, permutation)
        self._point_at_graph_batch(forward_batch, static, batch_info)

    def _point_at_graph_batch(self, forward_batch, static: StaticWorkItems, batch_info) -> None:
        """The prepared batch is a graph family's: SGLang's view of it and our static items."""
        batch_info.bs = forward_batch.batch_size
        batch_info.num_segments = forward_batch.batch_size
        self.use_graph_path = True
        self.static_items = static
        self.work_items = None
        self.batch_info = batch_info

    # ------------------------------------------------------------------ compute
    def forward_with_base(self, layer, x, base_fn, lora_a, lora_b, output_offset, offsets, **kwargs):
        """Base + LoRA of a plain linear layer in one call: graph batches through the
        graph-safe ops (with the shrink inside the base GEMM where the layer has the pool's A
        rows appended, else decode graphs and small prefill graphs with the shrink beside the
        base GEMM, larger prefill graphs in sequence), eager batches the base then
        ``ops.lora_apply``. TP all-reduce and
        lm_head take SGLang's path, which calls the ``run_*`` methods below."""
        plain = kwargs.get("all_reduce") is None and kwargs.get("kind", "linear") == "linear"
        if not plain or kwargs.get("pruned_batch_info") is not None:
            return super().forward_with_base(layer, x, base_fn, lora_a, lora_b, output_offset, offsets, **kwargs)
        if self.eager_in_gemm_kept:
            fused = getattr(layer, in_gemm_weights.ATTR, None)
            if fused is not None and self.eager_small_gemm and self._small_gemm_runs(layer, fused, lora_a, lora_b,
                                                                                     offsets):
                small = self._small_gemm_calls.get(id(layer))
                if small is None or not small.serves(fused.weight, lora_a, lora_b, self.eager_static, self._eager_bound):
                    small = self._small_gemm_calls[id(layer)] = ops.KeptSmallGemmCall(
                        fused.weight, fused.bias, fused.out_features, lora_a, lora_b, self.eager_static,
                        [int(o) for o in offsets], self._eager_bound, self._kept_plans_dict())
                with _profile_range("vlora.eager_lora"):
                    return small(x)
            if fused is not None:
                call = self._in_gemm_calls.get(id(layer))
                if call is None or not call.serves(fused.weight, lora_b, self.eager_static, self._eager_bound):
                    call = self._in_gemm_calls[id(layer)] = ops.KeptInGemmCall(
                        fused.weight, fused.bias, fused.out_features, lora_b, self.eager_static,
                        [int(o) for o in offsets], self._eager_bound, self._kept_plans_dict())
                with _profile_range("vlora.eager_lora"):
                    return call(x)
        slice_offsets = [int(o) for o in offsets]
        if self.use_graph_path:
            self._note_captured_shape(x, lora_a, lora_b, offsets, layer)
            fused = getattr(layer, in_gemm_weights.ATTR, None)
            if fused is not None and self.static_items.covers_tokens:
                return ops.lora_apply_static_in_gemm(x, fused.weight, fused.bias, fused.out_features, lora_b,
                                                     self.static_items, slice_offsets, self.impl)
            # By the rows the graph runs (its captured size), not the batch's tokens.
            large_prefill = self.static_items is self.prefill_graph_items and x.shape[0] > SIDE_STREAM_MAX_TOKENS
            stream = None if large_prefill else self.side_stream
            return ops.lora_apply_static_with_base(
                x, lora_a, lora_b, self.static_items, slice_offsets, base_fn, stream, self.impl
            )
        if self.gemm_items is not None:
            output = self._lora_gemm(layer, x, lora_a, lora_b, slice_offsets)
            if output is not None:
                return output
        if self.eager_in_gemm:  # without kept plans: the reference (a CPU) or a non-Triton --vlora-atmm-impl
            fused = getattr(layer, in_gemm_weights.ATTR, None)
            if fused is not None:
                with _profile_range("vlora.eager_lora"):
                    return ops.lora_apply_static_in_gemm(x, fused.weight, fused.bias, fused.out_features, lora_b,
                                                         self.eager_static, slice_offsets, self.impl,
                                                         plans=self._kept_plans_dict())
        # Eager: one call per module (SGLang's path is a shrink call and an expand call
        # through the layer's own wrapper, each paying the host cost of a lookup).
        return self._eager_apply(x, lora_a, lora_b, slice_offsets, base_fn())

    def _small_gemm_runs(self, layer, fused, lora_a, lora_b, offsets) -> bool:
        """Whether the one kernel of small eager batches runs this layer (decided at its first
        such batch; a layer it cannot run keeps the in-GEMM call, and the reason is logged once)."""
        key = id(layer)
        if key not in self._small_gemm_reasons:
            why = small_gemm.unsupported(fused.weight, fused.out_features, lora_a, lora_b, self.eager_static,
                                         [int(o) for o in offsets])
            if why is not None and why not in self._small_gemm_reasons.values():
                logger.info("sglang-vlora: small eager batches keep the in-GEMM call on a %s module: %s",
                            tuple(fused.weight.shape), why)
            self._small_gemm_reasons[key] = why
        return self._small_gemm_reasons[key] is None

    def _eager_apply(self, x, lora_a, lora_b, slice_offsets: list[int], output: torch.Tensor) -> torch.Tensor:
        """``output += LoRA`` of an eager batch: by the kept plans over the static items where they
        run this shape, else over the batch's device items."""
        with _profile_range("vlora.eager_lora"):
            if self.eager_kept and ops.lora_apply_kept(x, lora_a, lora_b, self.eager_static, slice_offsets, output,
                                                       self._kept_plans_dict(), self.impl):
                return output
            return ops.lora_apply(x, lora_a, lora_b, self.work_items, slice_offsets, output, self.impl)

    def _kept_plans_dict(self) -> dict:
        """The kept launch plans, started over past ``EAGER_PLANS`` of them."""
        if len(self._eager_plans) >= EAGER_PLANS:
            self._eager_plans.clear()
        return self._eager_plans

    def _lora_gemm(self, layer, x, lora_a, lora_b, slice_offsets: list[int]) -> torch.Tensor | None:
        """Base + bias + LoRA of an eager batch in ATMM's own GEMM (ops.lora_apply_gemm), over the
        layer's appended-rows stack; None where the layer has none or the op cannot run these
        operands (the module then takes the usual path: the same sums, other kernels)."""
        fused = getattr(layer, in_gemm_weights.ATTR, None)
        if fused is None:
            return None
        weight = fused.weight[: fused.out_features]
        # The batch's gemm_items are never permuted nor overlapping: the shape decides.
        key = (x.dtype, x.stride(), tuple(weight.shape), tuple(lora_b.shape), tuple(slice_offsets))
        if key not in self._lora_gemm_reasons:
            reason = ("pool max rank above 64" if lora_b.shape[2] > LORA_GEMM_MAX_RANK
                      else gemm_lora.unsupported(x, weight, lora_b, slice_offsets))
            self._lora_gemm_reasons[key] = reason
            if reason is not None:
                logger.info("LoRA in the plugin's GEMM not used for a %s module: %s", tuple(weight.shape), reason)
        if self._lora_gemm_reasons[key] is not None:
            return None
        bias = None if fused.bias is None else fused.bias[: fused.out_features]
        with _profile_range("vlora.eager_lora_gemm"):
            output = ops.lora_apply_gemm(x, weight, bias, lora_a, lora_b, self.gemm_items, slice_offsets)
        if not self._lora_gemm_ran:
            self._lora_gemm_ran = True
            self.batches_by_layout["eager_lora_gemm"] += 1
        return output

    def run_lora_a_sgemm(self, x: torch.Tensor, weights: torch.Tensor, stack_num: int = 1, *args, **kwargs) -> torch.Tensor:
        if self.use_graph_path:
            return ops.lora_shrink_static(x, weights, self.static_items, stack_num, impl=self.impl)
        with _profile_range("vlora.eager_lora"):
            return ops.lora_shrink(x, weights, self.work_items, stack_num, self.impl)

    def run_lora_b_sgemm(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        output_offset_cpu: torch.Tensor | None = None,
        base_output: torch.Tensor | None = None,
        *args,
        **kwargs,
    ) -> torch.Tensor:
        offsets = _offsets(output_offset_cpu, weights)
        output = self._output(base_output, x, offsets)
        if self.use_graph_path:
            return ops.lora_expand_static(x, weights, self.static_items, offsets, output, impl=self.impl)
        with _profile_range("vlora.eager_lora"):
            return ops.lora_expand(x, weights, self.work_items, offsets, output, self.impl)

    def run_qkv_lora(
        self,
        x: torch.Tensor,
        qkv_lora_a: torch.Tensor,
        qkv_lora_b: torch.Tensor,
        output_offset: torch.Tensor | None = None,
        output_offset_cpu: torch.Tensor | None = None,
        max_qkv_out_dim: int | None = None,
        base_output: torch.Tensor | None = None,
        n_slices: int = 3,
        *args,
        **kwargs,
    ) -> torch.Tensor:
        offsets = _offsets(output_offset_cpu, qkv_lora_b)
        if len(offsets) - 1 != n_slices:
            raise ValueError(f"{n_slices} slices but output offsets {offsets}")
        return self._apply(x, qkv_lora_a, qkv_lora_b, offsets, base_output)

    def run_gate_up_lora(
        self,
        x: torch.Tensor,
        gate_up_lora_a: torch.Tensor,
        gate_up_lora_b: torch.Tensor,
        output_offset: torch.Tensor | None = None,
        output_offset_cpu: torch.Tensor | None = None,
        base_output: torch.Tensor | None = None,
        *args,
        **kwargs,
    ) -> torch.Tensor:
        offsets = _offsets(output_offset_cpu, gate_up_lora_b)
        return self._apply(x, gate_up_lora_a, gate_up_lora_b, offsets, base_output)

    def _apply(self, x, lora_a, lora_b, offsets: list[int], base_output):
        output = self._output(base_output, x, offsets)
        if self.use_graph_path:
            self._note_captured_shape(x, lora_a, lora_b, offsets)
            return ops.lora_apply_static(x, lora_a, lora_b, self.static_items, offsets, output, impl=self.impl)
        return self._eager_apply(x, lora_a, lora_b, offsets, output)

    @staticmethod
    def _output(base_output, x, offsets):
        if base_output is not None:
            return base_output
        return torch.zeros((x.shape[0], offsets[-1]), dtype=x.dtype, device=x.device)


def _capturing(device: torch.device) -> bool:
    """Whether a CUDA graph capture is under way on ``device``'s current stream."""
    return torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()


def _offsets(output_offset_cpu: torch.Tensor | None, lora_b: torch.Tensor) -> list[int]:
    if output_offset_cpu is None:
        return [0, lora_b.shape[-2]]
    return [int(v) for v in output_offset_cpu.tolist()]
