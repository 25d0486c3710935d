"""The atmm backend against an fp64 per-token reference: mixed ranks in one batch,
stacked qkv / gate_up slices, empty segments, the no-adapter slot, stale memory-pool
columns beyond a slot's rank; and its decode-CUDA-graph path (static work items filled
in place) as SGLang drives it: prepared once for capture with base-only requests, then
before every replay with other adapters, more / fewer / no items, in unmerge, merge and
mixture mode, with NaN in every row and pool column it must not read.

The graph path runs the ``ops.*_static`` calls: here their graph-safe torch form, and
under ``TRITON_INTERPRET=1`` (as ``make test`` runs) also the Triton kernels."""

import os
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sglang_vlora.backend import ATMMLoRABackend, group_by_slot, segments_from_requests
from sglang_vlora.config import VLoRAConfig
from sglang_vlora.modes.delora import max_mode_items
from sglang_vlora.runtime import VLoRARuntime
from tests.triton_interpreter import use_triton_interpreter

D_IN = 24
MAX_RANK = 16
SLOTS_RANKS = [0, 8, 16, 4]  # slot 0 is the no-adapter slot
SCALINGS = [0.0, 2.0, 0.5, 1.5]


def pools(slices: list[int], seed: int = 0):
    """Memory pools as SGLang lays them out, with garbage beyond each slot's rank
    (a previous, larger adapter may have left it there)."""
    g = torch.Generator().manual_seed(seed)
    n = len(slices)
    a = torch.randn(len(SLOTS_RANKS), n * MAX_RANK, D_IN, generator=g)
    b = torch.randn(len(SLOTS_RANKS), sum(slices), MAX_RANK, generator=g)
    return a, b


def stacked_layer(slices: list[int], seed: int):
    """``(a, b, w, bias, layer)``: pools with NaN past every slot's rank (no path may read them),
    a base weight and bias, and a LoRA layer whose base weight has the pool's A rows appended
    (``in_gemm_weights``' stack, bias zero-padded)."""
    from sglang_vlora.in_gemm_weights import ATTR, InGemmWeights

    a, b = pools(slices, seed=seed)
    for slot, r in enumerate(SLOTS_RANKS):
        a[slot, len(slices) * r :] = float("nan")
        b[slot, :, r:] = float("nan")
    g = torch.Generator().manual_seed(seed + 1000)
    w, bias = torch.randn(sum(slices), D_IN, generator=g), torch.randn(sum(slices), generator=g)
    layer = SimpleNamespace(**{ATTR: InGemmWeights(weight=torch.cat([w, a.reshape(-1, D_IN)]),
                                                   bias=torch.cat([bias, torch.zeros(a.numel() // D_IN)]),
                                                   out_features=sum(slices))})
    return a, b, w, bias, layer


def reference(x, a, b, token_slots, slices):
    offsets = [0]
    for s in slices:
        offsets.append(offsets[-1] + s)
    out = torch.zeros(x.shape[0], offsets[-1], dtype=torch.float64)
    for t, slot in enumerate(token_slots):
        r = SLOTS_RANKS[slot]
        if r == 0:
            continue
        for j in range(len(slices)):
            xa = x[t].double() @ a[slot, j * r : (j + 1) * r].double().T
            out[t, offsets[j] : offsets[j + 1]] += SCALINGS[slot] * (xa @ b[slot, offsets[j] : offsets[j + 1], :r].double().T)
    return out, offsets


def extend_batch(seq_lens):
    return SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(seq_lens),
        extend_seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        extend_seq_lens_cpu=list(seq_lens),
    )


def decode_batch(n):
    return SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=n)


REQUESTS = [  # (seq_len, slot): mixed ranks, repeats, an empty segment, base requests
    (5, 1), (3, 1), (0, 2), (7, 2), (4, 0), (6, 3), (2, 1), (1, 0),
]


@pytest.mark.parametrize("slices", [[20], [12, 6, 6], [10, 10]], ids=["single", "qkv", "gate_up"])
def test_eager_path_matches_reference(slices):
    seq_lens = [n for n, _ in REQUESTS]
    slots = [s for _, s in REQUESTS]
    token_slots = [s for n, s in REQUESTS for _ in range(n)]
    x = torch.randn(sum(seq_lens), D_IN)
    a, b = pools(slices)
    expected, offsets = reference(x, a, b, token_slots, slices)

    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"))
    backend.prepare_lora_batch(extend_batch(seq_lens), slots, SLOTS_RANKS, SCALINGS, use_cuda_graph=False)
    base = torch.randn(x.shape[0], offsets[-1])
    offsets_cpu = torch.tensor(offsets, dtype=torch.int32)
    if len(slices) == 1:
        inter = backend.run_lora_a_sgemm(x, a)
        got = backend.run_lora_b_sgemm(inter, b, output_offset_cpu=offsets_cpu, base_output=base.clone())
    elif len(slices) == 3:
        got = backend.run_qkv_lora(x, a, b, output_offset_cpu=offsets_cpu, base_output=base.clone())
    else:
        got = backend.run_gate_up_lora(x, a, b, output_offset_cpu=offsets_cpu, base_output=base.clone())
    torch.testing.assert_close(got.double() - base.double(), expected, rtol=1e-4, atol=1e-4)
    assert backend.batch_info.expected_tokens == x.shape[0]


class FakeController:
    """The mode controller as the backend sees it: the merged adapter's pool slot."""

    def __init__(self, merged_slot):
        self.merged_uid = None if merged_slot is None else f"uid{merged_slot}"
        self.slot = merged_slot

    def merged_slot(self, lora_ranks, scalings):
        lora_ranks[self.slot] = SLOTS_RANKS[self.slot]
        scalings[self.slot] = SCALINGS[self.slot]
        return self.slot


def mode_reference(x, a, b, token_slots, slices, merged):
    """What the backend must add: +own delta for other adapters' tokens, -merged delta
    for every token not of the merged adapter (none when nothing is merged)."""
    own, offsets = reference(x, a, b, [s if s != merged else 0 for s in token_slots], slices)
    if merged is None:
        return own, offsets
    minus, _ = reference(x, a, b, [merged if s != merged else 0 for s in token_slots], slices)
    return own - minus, offsets


GRAPH_BS = 8
# (label, merged slot, request slots, items) replayed in order after a base-only
# capture. Slot 2 (rank 16) is the merged adapter; ranks 0 / 8 / 16 / 4 mix in a batch.
REPLAYS = [
    ("unmerge: requests of one adapter apart, grouped by slot", None, [1, 3, 3, 2, 0, 1, 2, 1], 3),
    ("mixture: grouped, k between the others, two layers", 2, [1, 2, 3, 2, 1, 2, 3, 1], 4),
    # grouped by slot: a base-only run (-k), slot 1 (+1 absorbing its -k), k, slot 3 (likewise)
    ("mixture: every slot, the most items", 2, [1, 0, 2, 3], 5),
    ("mixture: fewer items, stale entries left from the batch before", 2, [3, 0, 2], 3),
    ("merge: only the merged adapter's requests, no items", 2, [2, 2, 2, 2, 2], 0),
    ("mixture: base-only requests (-k only)", 2, [0, 0, 2, 0], 1),
    ("unmerge: one request", None, [3], 1),
    ("unmerge: base only, no items", None, [0] * GRAPH_BS, 0),
]


def run_layer(backend, kind, x, a, b, offsets, base):
    offsets_cpu = torch.tensor(offsets, dtype=torch.int32)
    if kind == "single":
        inter = backend.run_lora_a_sgemm(x, a)
        return backend.run_lora_b_sgemm(inter, b, output_offset_cpu=offsets_cpu, base_output=base)
    if kind == "qkv":
        return backend.run_qkv_lora(x, a, b, output_offset_cpu=offsets_cpu, base_output=base)
    if kind == "gate_up":
        return backend.run_gate_up_lora(x, a, b, output_offset_cpu=offsets_cpu, base_output=base)
    # SGLang's LoRA layers call forward_with_base(layer, x, base_fn, ...)
    return backend.forward_with_base(None, x, lambda: base, a, b, None, tuple(offsets))


IMPLS = ["torch"] + (["auto"] if os.environ.get("TRITON_INTERPRET") == "1" else [])
KINDS = {"single": [20], "qkv": [12, 6, 6], "gate_up": [10, 10], "with_base": [12, 6, 6]}


@pytest.mark.parametrize("impl", IMPLS, ids=lambda i: "triton" if i == "auto" else i)
@pytest.mark.parametrize("kind", list(KINDS))
def test_graph_path_replays_any_mode_and_item_count(kind, impl):
    slices = KINDS[kind]
    a, b = pools(slices, seed=3)
    # NaN where a slot's rank ends: no path may read pool entries past the rank.
    for slot, r in enumerate(SLOTS_RANKS):
        a[slot, len(slices) * r :] = float("nan")
        b[slot, :, r:] = float("nan")
    rt = VLoRARuntime(VLoRAConfig())
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl=impl, runtime=rt)
    backend.init_decode_cuda_graph_batch_info(max_bs_in_cuda_graph=GRAPH_BS, num_tokens_per_req=1)
    static = backend.graph_items
    assert static.capacity == max_mode_items(len(SLOTS_RANKS)) and static.max_layers == 2
    assert static.paired  # a merging policy: mixture's pairs in one expand launch
    buffers = (static.packed.data_ptr(), static.permutation.data_ptr())

    # Capture: SGLang prepares a padded, base-only batch (no items), then captures.
    rt.controller = FakeController(None)
    backend.prepare_lora_batch(decode_batch(GRAPH_BS), [0] * GRAPH_BS, SLOTS_RANKS, SCALINGS, use_cuda_graph=True)
    assert backend.use_graph_path and backend.batch_info.use_cuda_graph
    offsets = reference(torch.zeros(1, D_IN), a, b, [0], slices)[1]
    g = torch.Generator().manual_seed(4)
    base = torch.randn(GRAPH_BS, offsets[-1], generator=g)
    assert torch.equal(run_layer(backend, kind, torch.randn(GRAPH_BS, D_IN, generator=g), a, b, offsets, base.clone()), base)

    for label, merged, slots, num_items in REPLAYS:
        rt.controller = FakeController(merged)
        ranks = [r if s in slots else 0 for s, r in enumerate(SLOTS_RANKS)]  # SGLang: batch's adapters only
        backend.prepare_lora_batch(decode_batch(len(slots)), slots, ranks, SCALINGS, use_cuda_graph=True)
        assert int((static.seg_lens > 0).sum()) == num_items, label
        assert backend.has_lora_work == (num_items > 0), label
        n = len(slots)
        # The replayed graph runs at the captured (padded) size; padding rows are NaN.
        x = torch.full((GRAPH_BS, D_IN), float("nan"))
        x[:n] = torch.randn(n, D_IN, generator=g)
        base = torch.randn(GRAPH_BS, offsets[-1], generator=g)
        got = run_layer(backend, kind, x, a, b, offsets, base.clone())
        expected, _ = mode_reference(x[:n], a, b, slots, slices, merged)
        torch.testing.assert_close(got[:n].double() - base[:n].double(), expected, rtol=1e-4, atol=1e-4, msg=label)
        assert torch.equal(got[n:], base[n:]), label
        assert (static.packed.data_ptr(), static.permutation.data_ptr()) == buffers, "buffers reallocated"


@pytest.mark.parametrize("impl", IMPLS, ids=lambda i: "triton" if i == "auto" else i)
def test_graph_path_with_the_shrink_in_the_gemm_replays_any_mode(impl):
    """A layer with the pool's A rows appended to its base weight (in_gemm_weights) runs one
    GEMM over both and one expand into a new output: base + bias + LoRA for every token,
    padding rows included, in every mode and item count of REPLAYS."""
    slices = [12, 6, 6]
    a, b, w, bias, layer = stacked_layer(slices, seed=13)
    g = torch.Generator().manual_seed(14)
    rt = VLoRARuntime(VLoRAConfig())
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl=impl, runtime=rt)
    backend.shrink_in_gemm = True
    backend.init_decode_cuda_graph_batch_info(max_bs_in_cuda_graph=GRAPH_BS, num_tokens_per_req=1)
    assert backend.graph_items.covers_tokens
    offsets = reference(torch.zeros(1, D_IN), a, b, [0], slices)[1]

    def run(x):
        return backend.forward_with_base(layer, x, lambda: pytest.fail("the base GEMM ran apart"), a, b, None,
                                         tuple(offsets))

    for label, merged, slots, _ in REPLAYS:
        rt.controller = FakeController(merged)
        ranks = [r if s in slots else 0 for s, r in enumerate(SLOTS_RANKS)]
        backend.prepare_lora_batch(decode_batch(len(slots)), slots, ranks, SCALINGS, use_cuda_graph=True)
        x = torch.randn(GRAPH_BS, D_IN, generator=g)  # padded to the captured size
        got = run(x)
        base = x.double() @ w.double().T + bias.double()
        expected = base.clone()
        expected[: len(slots)] += mode_reference(x[: len(slots)], a, b, slots, slices, merged)[0]
        assert got.is_contiguous() and got.shape == base.shape
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4, msg=label)
    # Eager batches (test_eager_batches_compute_the_shrink_in_the_gemm has them) take the same result.
    backend.prepare_lora_batch(extend_batch([3]), [1], SLOTS_RANKS, SCALINGS, use_cuda_graph=False)
    x = torch.randn(3, D_IN, generator=g)
    eager = backend.forward_with_base(layer, x, lambda: x @ w.T + bias, a, b, None, tuple(offsets))
    expected = x.double() @ w.double().T + bias.double() + reference(x, a, b, [1, 1, 1], slices)[0]
    torch.testing.assert_close(eager.double(), expected, rtol=1e-4, atol=1e-4)


# (label, merged slot, (tokens, slot) per request) of consecutive eager batches
EAGER_BATCHES = [
    ("unmerge: requests of one adapter apart (permuted), the no-adapter slot", None,
     [(5, 1), (3, 3), (4, 1), (2, 0), (6, 2)]),
    ("unmerge: the same token count again, other adapters", None, [(10, 3), (10, 2)]),
    ("mixture: k between the others, base-only requests", 2, [(4, 1), (3, 2), (6, 0), (2, 3), (5, 2)]),
    ("merge: only k's requests, no work: the usual path", 2, [(7, 2)]),
    ("unmerge: fewer items than before, stale entries left", None, [(9, 3)]),
]


# Eager batches run the reference on CPU tensors with "auto" (as the eager ops do): Triton by name.
EAGER_IMPLS = ["torch"] + (["triton"] if os.environ.get("TRITON_INTERPRET") == "1" else [])


@pytest.mark.parametrize("impl", EAGER_IMPLS)
def test_eager_batches_compute_the_shrink_in_the_gemm(impl):
    """Eager batches of at most ``--vlora-eager-in-gemm-max-tokens`` tokens run a layer with the
    appended rows as graph batches do: one GEMM over the base weight and the pool's A rows, one
    expand into a new output (SGLang's base GEMM not run), from static buffers allocated once
    and filled per batch. Every batch of EAGER_BATCHES in turn, in unmerge, mixture and merge,
    against fp64 with NaN past every rank; a layer without the rows and a batch above the
    limit take the usual path; the limit 0 turns it off."""
    slices = [12, 6, 6]
    a, b, w, bias, layer = stacked_layer(slices, seed=31)
    g = torch.Generator().manual_seed(32)
    rt = VLoRARuntime(VLoRAConfig(eager_in_gemm_max_tokens=20))
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl=impl, runtime=rt)
    backend.shrink_in_gemm = True
    offsets = tuple(reference(torch.zeros(1, D_IN), a, b, [0], slices)[1])

    def base_of(x):
        return x.double() @ w.double().T + bias.double()

    buffers, ran = {}, 0
    for label, merged, requests in EAGER_BATCHES:
        rt.controller = FakeController(merged)
        lens, slots = [n for n, _ in requests], [s for _, s in requests]
        backend.prepare_lora_batch(extend_batch(lens), slots, list(SLOTS_RANKS), list(SCALINGS), use_cuda_graph=False)
        token_slots = [s for n, s in requests for _ in range(n)]
        x = torch.randn(sum(lens), D_IN, generator=g)
        expected = base_of(x) + mode_reference(x, a, b, token_slots, slices, merged)[0]
        has_work = backend.has_lora_work
        assert backend.eager_in_gemm == has_work, label
        ran += has_work
        base_fn = (lambda: pytest.fail("SGLang's base GEMM ran")) if has_work else (lambda x=x: x @ w.T + bias)
        got = backend.forward_with_base(layer, x, base_fn, a, b, None, offsets)
        assert got.is_contiguous(), label
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4, msg=label)
        # The layer with the rows read only the static buffers: the batch's items were not built
        # a second time for the device.
        assert backend._work_items is None or not has_work, label
        # A layer without the appended rows, in the same batch: the base GEMM, then the shrink and
        # expand; Triton's over the same static buffers (kept plans), the reference over device
        # items built now.
        plain = backend.forward_with_base(SimpleNamespace(), x, lambda x=x: x @ w.T + bias, a, b, None, offsets)
        torch.testing.assert_close(plain.double(), expected, rtol=1e-4, atol=1e-4, msg=label)
        assert backend.eager_kept == (has_work and impl == "triton"), label
        assert (backend._work_items is None) == backend.eager_kept, label
        if has_work:
            static = backend.eager_static
            assert static.paired == (merged is not None), label
            buffers.setdefault(static.paired, (static.packed.data_ptr(), static.permutation.data_ptr()))
            assert (static.packed.data_ptr(), static.permutation.data_ptr()) == buffers[static.paired], label
    assert backend.batches_by_layout["eager_in_gemm"] == ran == 4

    # Above the limit, and with the limit 0: the usual path, with SGLang's base GEMM.
    for limit, lens in ((20, [15, 6]), (0, [4])):
        rt = VLoRARuntime(VLoRAConfig(eager_in_gemm_max_tokens=limit), controller=FakeController(None))
        backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl=impl,
                                  runtime=rt)
        backend.shrink_in_gemm = True
        backend.prepare_lora_batch(extend_batch(lens), [1, 3][: len(lens)], SLOTS_RANKS, SCALINGS, use_cuda_graph=False)
        assert not backend.eager_in_gemm and backend.eager_kept == (impl == "triton")
        x = torch.randn(sum(lens), D_IN, generator=g)
        got = backend.forward_with_base(layer, x, lambda x=x: x @ w.T + bias, a, b, None, offsets)
        token_slots = [s for n, s in zip(lens, [1, 3], strict=False) for _ in range(n)]
        expected = base_of(x) + reference(x, a, b, token_slots, slices)[0]
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="kept plans run Triton's kernels")
def test_eager_in_gemm_calls_are_kept_per_layer_and_token_bound():
    """With kept plans, a layer's eager in-GEMM call (``ops.KeptInGemmCall``) is built once per
    token bound and buffers and reused by the next batches of that bound; a batch of another
    bound gets a new one; a call never runs a batch of another size than its items were filled
    for. Every batch against fp64."""
    slices = [12, 6, 6]
    a, b, w, bias, layer = stacked_layer(slices, seed=41)
    g = torch.Generator().manual_seed(42)
    rt = VLoRARuntime(VLoRAConfig(eager_in_gemm_max_tokens=64, eager_small_gemm_max_tokens=0),
                      controller=FakeController(None))
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl="triton",
                              runtime=rt)
    backend.shrink_in_gemm = True
    offsets = tuple(reference(torch.zeros(1, D_IN), a, b, [0], slices)[1])

    def run(lens: list[int], slots: list[int]):
        backend.prepare_lora_batch(extend_batch(lens), slots, list(SLOTS_RANKS), list(SCALINGS), use_cuda_graph=False)
        assert backend.eager_in_gemm_kept and not backend.eager_small_gemm
        x = torch.randn(sum(lens), D_IN, generator=g)
        got = backend.forward_with_base(layer, x, lambda: pytest.fail("SGLang's base GEMM ran"), a, b, None, offsets)
        token_slots = [s for n, s in zip(lens, slots, strict=True) for _ in range(n)]
        expected = x.double() @ w.double().T + bias.double() + reference(x, a, b, token_slots, slices)[0]
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)
        return backend._in_gemm_calls[id(layer)]

    first = run([5, 4], [1, 3])  # 9 tokens: the plans of 16
    assert run([6, 8], [2, 1]) is first  # 14 tokens: the same bound and buffers
    second = run([20], [3])  # the plans of 32
    assert second is not first and second.bound == 32
    with pytest.raises(ValueError, match="copy items reach position 20"):
        second(torch.randn(19, D_IN, generator=g))
    assert run([3, 2], [2, 1]) is not second  # back to 16: rebuilt (its plan comes from the kept ones)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the one-launch kernel is Triton's")
def test_small_eager_batches_run_one_kernel_a_module():
    """Unmerged eager batches of at most ``--vlora-eager-small-gemm-max-tokens`` tokens run a layer
    with the appended rows as one kernel (``ops.KeptSmallGemmCall``: base GEMM, shrink and expand),
    kept per layer and token bound; SGLang's base GEMM does not run. A mixture batch, a batch above
    the limit and the limit 0 take the in-GEMM call. Every batch against fp64 with NaN past every rank."""
    slices = [12, 6, 6]
    a, b, w, bias, layer = stacked_layer(slices, seed=61)
    g = torch.Generator().manual_seed(62)
    offsets = tuple(reference(torch.zeros(1, D_IN), a, b, [0], slices)[1])

    def backend_for(limit: int) -> tuple[ATMMLoRABackend, VLoRARuntime]:
        rt = VLoRARuntime(VLoRAConfig(eager_in_gemm_max_tokens=64, eager_small_gemm_max_tokens=limit),
                          controller=FakeController(None))
        backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl="triton",
                                  runtime=rt)
        backend.shrink_in_gemm = True
        return backend, rt

    def run(backend, requests, merged=None) -> None:
        lens, slots = [n for n, _ in requests], [s for _, s in requests]
        backend.prepare_lora_batch(extend_batch(lens), slots, list(SLOTS_RANKS), list(SCALINGS), use_cuda_graph=False)
        x = torch.randn(sum(lens), D_IN, generator=g)
        got = backend.forward_with_base(layer, x, lambda: pytest.fail("SGLang's base GEMM ran"), a, b, None, offsets)
        token_slots = [s for n, s in requests for _ in range(n)]
        expected = x.double() @ w.double().T + bias.double() + mode_reference(x, a, b, token_slots, slices, merged)[0]
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)

    backend, rt = backend_for(16)
    run(backend, [(5, 1), (2, 0), (4, 3), (3, 1)])  # 14 tokens, one adapter's requests apart (permuted)
    first = backend._small_gemm_calls[id(layer)]
    assert backend.eager_small_gemm and id(layer) not in backend._in_gemm_calls
    run(backend, [(9, 2), (7, 3)])  # 16 tokens: the same bound, the same call
    assert backend._small_gemm_calls[id(layer)] is first and first.bound == 16
    run(backend, [(10, 2), (7, 3)])  # above the limit: the in-GEMM call
    assert not backend.eager_small_gemm and backend.eager_in_gemm_kept and id(layer) in backend._in_gemm_calls
    rt.controller = FakeController(2)
    run(backend, [(4, 1), (3, 2), (2, 0)], merged=2)  # mixture: pairs, the in-GEMM call
    assert not backend.eager_small_gemm and backend.eager_in_gemm_kept
    assert backend.batches_by_layout["eager_small_gemm"] == 2
    backend, _ = backend_for(0)
    run(backend, [(5, 1)])
    assert not backend.eager_small_gemm and not backend._small_gemm_calls

    # A layer the kernel cannot run (its stacked weight stored column by column: the kernel reads
    # rows) keeps the in-GEMM call, whose torch GEMM takes any strides; the reason is kept per layer.
    from sglang_vlora.in_gemm_weights import ATTR, InGemmWeights

    fused = getattr(layer, ATTR)
    layer = SimpleNamespace(**{ATTR: InGemmWeights(weight=fused.weight.t().contiguous().t(), bias=fused.bias,
                                                   out_features=fused.out_features)})
    backend, _ = backend_for(16)
    run(backend, [(5, 1), (4, 3)])
    assert backend.eager_small_gemm and id(layer) in backend._in_gemm_calls and not backend._small_gemm_calls
    assert "not contiguous" in backend._small_gemm_reasons[id(layer)]


# (label, merged slot, (tokens, slot) per request) of consecutive eager batches run by kept plans:
# token counts that share a bound (ops.kept_plan_tokens), and one past the eager buffers' first size
KEPT_BATCHES = [
    ("unmerge: one adapter's requests apart (permuted), the no-adapter slot; bound 32", None,
     [(5, 1), (3, 3), (4, 1), (2, 0), (6, 2)]),
    ("unmerge: other adapters, another token count of the same bound", None, [(17, 3), (10, 2)]),
    ("mixture: base-only requests, the same bound", 2, [(4, 1), (3, 2), (6, 0), (2, 3), (5, 2)]),
    ("unmerge: one request, bound 16, stale entries left", None, [(9, 3)]),
    ("mixture: past the buffers' first 1024 tokens (reallocated, plans start over)", 2,
     [(700, 2), (300, 1), (100, 3)]),
    ("unmerge: bound 32 again, after the reallocation", None, [(12, 1), (8, 3)]),
]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the kept plans run Triton (its interpreter)")
def test_eager_batches_run_launch_plans_kept_across_batches():
    """Eager batches whose items go into static buffers, run by launch plans kept per module shape
    and token bound (ops.lora_apply_kept): every batch of KEPT_BATCHES in turn, through
    forward_with_base and SGLang's qkv call, against fp64 with NaN past every rank; a batch of a
    bound seen before builds no plan, and no batch builds device items. Batches with an adapter
    merged go into paired buffers (two layers of shrink rows), the others into one-layer ones."""
    slices = [12, 6, 6]
    a, b, _, _, _ = stacked_layer(slices, seed=51)
    g = torch.Generator().manual_seed(52)
    # The eager buffers' first size is the in-GEMM limit's, at least 1024 tokens: 1024 here.
    rt = VLoRARuntime(VLoRAConfig(eager_in_gemm_max_tokens=1024))
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl="triton",
                              runtime=rt)
    assert backend.kept_plans
    offsets = reference(torch.zeros(1, D_IN), a, b, [0], slices)[1]
    plans = []
    for label, merged, requests in KEPT_BATCHES:
        rt.controller = FakeController(merged)
        lens, slots = [n for n, _ in requests], [s for _, s in requests]
        backend.prepare_lora_batch(extend_batch(lens), slots, list(SLOTS_RANKS), list(SCALINGS), use_cuda_graph=False)
        assert backend.eager_kept and not backend.eager_in_gemm, label
        x = torch.randn(sum(lens), D_IN, generator=g)
        expected = mode_reference(x, a, b, [s for n, s in requests for _ in range(n)], slices, merged)[0]
        for kind in ("with_base", "qkv"):
            base = torch.randn(sum(lens), offsets[-1], generator=g)
            got = run_layer(backend, kind, x, a, b, offsets, base.clone())
            torch.testing.assert_close(got.double() - base.double(), expected, rtol=1e-4, atol=1e-4,
                                       msg=f"{label} ({kind})")
        assert backend._work_items is None, label
        assert backend.eager_static.paired == (merged is not None), label
        plans.append(sorted(key[1:3] for key in backend._eager_plans if key[0] == "apply"))
    # (bound, paired): mixture batches in buffers of their own; a reallocation starts every plan over
    assert plans == [[(32, False)], [(32, False)], [(32, False), (32, True)], [(16, False), (32, False), (32, True)],
                     [(1280, True)], [(32, False), (1280, True)]]
    assert backend._eager_buffers[True].max_tokens == 2048 and backend._eager_buffers[False].max_tokens == 1024
    assert backend.batches_by_layout["eager_kept"] == len(KEPT_BATCHES)


def test_kept_plans_leave_a_shape_the_table_gives_another_implementation(monkeypatch):
    """Where the tiling table picks cuBLAS (or the CUDA kernel) for a shape, ops.lora_apply_kept
    launches nothing and says so, once per shape: the caller runs lora_apply over device items."""
    from sglang_vlora.atmm import ops
    from sglang_vlora.atmm.static_items import StaticWorkItems

    picks = []
    monkeypatch.setattr(ops, "_pick", lambda op, t, dims, impl: picks.append(op) or ("cublas", None))
    items = StaticWorkItems.allocate(capacity=4, max_tokens=64, num_slots=len(SLOTS_RANKS), device="cpu")
    a, b = pools([20])
    x, out = torch.randn(10, D_IN), torch.zeros(10, 20)
    plans = {}
    for _ in range(2):
        assert not ops.lora_apply_kept(x, a, b, items, [0, 20], out, plans, impl="auto")
    assert torch.equal(out, torch.zeros(10, 20)) and picks == ["shrink", "expand"]
    with pytest.raises(ValueError, match="Triton"):
        ops.lora_apply_kept(x, a, b, items, [0, 20], out, {}, impl="cuda")


def test_kept_plan_bounds():
    """Powers of two (at least 16) up to 256 tokens, then multiples of 256."""
    from sglang_vlora.atmm.ops import kept_plan_tokens

    assert [kept_plan_tokens(n) for n in (1, 16, 17, 200, 256, 257, 1000, 1024, 1300, 8192)] == [
        16, 16, 32, 256, 256, 512, 1024, 1024, 1536, 8192]


def test_graph_path_matches_eager_path_in_mixture():
    """One batch, both layouts: the same items, the same result."""
    slices = [12, 6, 6]
    a, b = pools(slices, seed=5)
    slots = [1, 2, 3, 2, 0, 1, 1]
    x = torch.randn(len(slots), D_IN)
    offsets = torch.tensor(reference(x, a, b, slots, slices)[1], dtype=torch.int32)
    rt = VLoRARuntime(VLoRAConfig(), controller=FakeController(2))
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl="torch", runtime=rt)
    backend.init_decode_cuda_graph_batch_info(max_bs_in_cuda_graph=8, num_tokens_per_req=1)
    backend.prepare_lora_batch(decode_batch(len(slots)), slots, SLOTS_RANKS, SCALINGS, use_cuda_graph=False)
    eager = backend.run_qkv_lora(x, a, b, output_offset_cpu=offsets)
    backend.prepare_lora_batch(decode_batch(len(slots)), slots, SLOTS_RANKS, SCALINGS, use_cuda_graph=True)
    graph = backend.run_qkv_lora(x, a, b, output_offset_cpu=offsets)
    torch.testing.assert_close(graph, eager, rtol=1e-5, atol=1e-5)


def test_graph_items_fit_every_batch_in_every_mode():
    """Random batches up to the graph's size (2 tokens per request, as in speculative
    verify) fill the static buffers in every mode without overflow."""
    g = torch.Generator().manual_seed(6)
    rt = VLoRARuntime(VLoRAConfig())
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl="torch", runtime=rt)
    backend.init_decode_cuda_graph_batch_info(max_bs_in_cuda_graph=6, num_tokens_per_req=2)
    for trial in range(300):
        n = int(torch.randint(1, 7, (1,), generator=g))
        slots = torch.randint(0, len(SLOTS_RANKS), (n,), generator=g).tolist()
        rt.controller = FakeController([None, 1, 2, 3][trial % 4])
        batch = SimpleNamespace(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=n, spec_info=SimpleNamespace(draft_token_num=2)
        )
        backend.prepare_lora_batch(batch, slots, SLOTS_RANKS, SCALINGS, use_cuda_graph=True)


def test_segments_group_consecutive_requests_only():
    starts, lengths, slots = segments_from_requests([2, 3, 1, 4], [1, 1, 2, 1])
    assert (starts, lengths, slots) == ([0, 5, 6], [5, 1, 4], [1, 2, 1])


def test_group_by_slot_sorts_only_when_a_slot_has_several_runs():
    assert group_by_slot([2, 3, 1], [1, 2, 3]) == ([0, 2, 5], [2, 3, 1], [1, 2, 3], None)
    # slot 1 in two runs: stable sort by slot, tokens of each request kept together
    starts, lengths, slots, perm = group_by_slot([2, 1, 3], [1, 2, 1])
    assert (starts, lengths, slots) == ([0, 5], [5, 1], [1, 2])
    assert perm == [0, 1, 3, 4, 5, 2]
    # decode: one token per request
    assert group_by_slot([1] * 5, [3, 1, 3, 1, 0])[2:] == ([0, 1, 3], [4, 1, 3, 0, 2])


def test_embedding_and_lm_head_targets_are_refused():
    backend = ATMMLoRABackend(max_loras_per_batch=2, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="lm_head"):
        backend.validate_lora_targets(torch.nn.Linear(2, 2), {"q_proj", "lm_head"})


def test_graph_batch_larger_than_captured_is_refused():
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl="torch")
    backend.init_decode_cuda_graph_batch_info(max_bs_in_cuda_graph=2, num_tokens_per_req=1)
    with pytest.raises(RuntimeError, match="exceeds"):
        backend.prepare_lora_batch(decode_batch(3), [1, 1, 1], SLOTS_RANKS, SCALINGS, use_cuda_graph=True)


def test_graph_items_take_one_layer_when_the_policy_never_merges():
    for policy, layers in (("unmerge-only", 1), ("vlora", 2), ("manual", 2)):
        rt = VLoRARuntime(VLoRAConfig(policy=policy))
        backend = ATMMLoRABackend(
            max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl="torch", runtime=rt
        )
        backend.init_decode_cuda_graph_batch_info(max_bs_in_cuda_graph=4, num_tokens_per_req=1)
        assert backend.graph_items.max_layers == layers, policy


PREFILL_TOKENS = 48  # the prefill graph's largest bucket
# (label, merged slot, (seq_len, slot) per request, graph bucket) replayed in order after a
# base-only capture, as SGLang's prefill graph runner drives it: padded to a captured bucket.
PREFILL_REPLAYS = [
    ("unmerge: one long request", None, [(30, 1)], 32),
    ("unmerge: one adapter's requests apart (a permutation)", None, [(5, 1), (9, 3), (4, 1), (6, 2)], 32),
    # the batch after a permuted one: positions the permutation left must read as the identity
    ("unmerge: more tokens, no permutation", None, [(20, 3), (17, 2), (8, 0)], PREFILL_TOKENS),
    ("mixture: k between the others, base-only requests", 2, [(6, 1), (7, 2), (5, 0), (9, 3)], 32),
    ("merge: only the merged adapter's requests", 2, [(12, 2), (10, 2)], 32),
    ("unmerge: base only", None, [(16, 0)], 16),
]


@pytest.mark.parametrize("impl", IMPLS, ids=lambda i: "triton" if i == "auto" else i)
def test_prefill_graph_path_replays_any_batch_in_its_buckets(impl):
    slices = [12, 6, 6]
    a, b = pools(slices, seed=7)
    for slot, r in enumerate(SLOTS_RANKS):  # NaN past each rank: never read
        a[slot, len(slices) * r :] = float("nan")
        b[slot, :, r:] = float("nan")
    rt = VLoRARuntime(VLoRAConfig())
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl=impl, runtime=rt)
    assert backend.supports_prefill_cuda_graph
    backend.init_prefill_cuda_graph_batch_info(max_num_tokens=PREFILL_TOKENS, max_num_requests=8)
    assert (backend.prefill_cuda_graph_max_bs, backend.prefill_cuda_graph_max_tokens) == (8, PREFILL_TOKENS)
    static = backend.prefill_graph_items
    assert static.max_tokens == PREFILL_TOKENS and static.capacity == max_mode_items(len(SLOTS_RANKS))
    buffers = static.packed.data_ptr()

    # Capture: a base-only batch of the bucket's size, then the layers run (no items).
    rt.controller = FakeController(None)
    backend.prepare_lora_batch(extend_batch([PREFILL_TOKENS]), [0], SLOTS_RANKS, SCALINGS, False, True)
    assert backend.use_graph_path and backend.static_items is static and not backend.has_lora_work
    assert backend.batch_info is backend.prefill_cuda_graph_batch_info
    offsets = reference(torch.zeros(1, D_IN), a, b, [0], slices)[1]
    g = torch.Generator().manual_seed(8)
    base = torch.randn(PREFILL_TOKENS, offsets[-1], generator=g)
    x = torch.randn(PREFILL_TOKENS, D_IN, generator=g)
    assert torch.equal(run_layer(backend, "with_base", x, a, b, offsets, base.clone()), base)

    for label, merged, requests, bucket in PREFILL_REPLAYS:
        rt.controller = FakeController(merged)
        seq_lens, slots = [n for n, _ in requests], [s for _, s in requests]
        ranks = [r if s in slots or s == merged else 0 for s, r in enumerate(SLOTS_RANKS)]
        backend.prepare_lora_batch(extend_batch(seq_lens), slots, ranks, SCALINGS, False, True)
        n = sum(seq_lens)
        x = torch.full((bucket, D_IN), float("nan"))  # padding rows of the bucket: never read
        x[:n] = torch.randn(n, D_IN, generator=g)
        base = torch.randn(bucket, offsets[-1], generator=g)
        for kind in ("with_base", "qkv"):
            got = run_layer(backend, kind, x, a, b, offsets, base.clone())
            token_slots = [s for ln, s in requests for _ in range(ln)]
            expected, _ = mode_reference(x[:n], a, b, token_slots, slices, merged)
            torch.testing.assert_close(got[:n].double() - base[:n].double(), expected, rtol=1e-4, atol=1e-4,
                                       msg=f"{label} ({kind})")
            assert torch.equal(got[n:], base[n:]), label
        assert static.packed.data_ptr() == buffers, "buffers reallocated"

    assert backend.batches_by_layout == {"eager": 0, "decode_graph": 0, "prefill_graph": 1 + len(PREFILL_REPLAYS),
                                         "eager_lora_gemm": 0, "eager_in_gemm": 0, "eager_kept": 0,
                                         "eager_small_gemm": 0}
    # A batch above the prefill graph's limits never reaches it (SGLang runs it eagerly): refused.
    with pytest.raises(RuntimeError, match="exceeds"):
        backend.prepare_lora_batch(extend_batch([PREFILL_TOKENS + 1]), [1], SLOTS_RANKS, SCALINGS, False, True)
    # An eager batch afterwards runs the eager items, not the graph's.
    backend.prepare_lora_batch(extend_batch([4]), [1], SLOTS_RANKS, SCALINGS, False, False)
    assert not backend.use_graph_path and backend.static_items is None and backend.work_items.num_items == 1


def test_graph_batch_before_its_buffers_is_refused():
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl="torch")
    with pytest.raises(RuntimeError, match="init_prefill_cuda_graph_batch_info"):
        backend.prepare_lora_batch(extend_batch([4]), [1], SLOTS_RANKS, SCALINGS, False, True)
    with pytest.raises(RuntimeError, match="init_decode_cuda_graph_batch_info"):
        backend.prepare_lora_batch(decode_batch(2), [1, 1], SLOTS_RANKS, SCALINGS, True)


def test_decode_and_small_prefill_graph_batches_overlap_the_shrink_on_the_side_stream(monkeypatch):
    """Decode graphs and prefill graphs of up to SIDE_STREAM_MAX_TOKENS tokens run the shrink
    beside the base GEMM on the side stream; larger prefill graphs and eager batches run in
    sequence (a large prefill's base GEMM leaves no SM for a shrink beside it: docs/perf.md)."""
    import sglang_vlora.backend as backend_module
    from sglang_vlora.atmm import ops

    streams = []
    monkeypatch.setattr(ops, "lora_apply_static_with_base",
                        lambda x, a, b, items, offsets, base_fn, side_stream, impl: streams.append(side_stream))
    monkeypatch.setattr(ops, "lora_apply", lambda *args: streams.append("eager"))
    slices = [12, 6, 6]
    a, b = pools(slices, seed=11)
    offsets = reference(torch.zeros(1, D_IN), a, b, [0], slices)[1]
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl="torch")
    backend.init_decode_cuda_graph_batch_info(max_bs_in_cuda_graph=4, num_tokens_per_req=1)
    monkeypatch.setattr(backend_module, "SIDE_STREAM_MAX_TOKENS", 8)
    backend.init_prefill_cuda_graph_batch_info(max_num_tokens=16, max_num_requests=2)
    side = object()  # a CUDA stream where there is a GPU; only its identity matters here
    backend.side_stream = side
    batches = [  # (batch, decode graph, prefill graph)
        (decode_batch(2), True, False),
        (extend_batch([6, 4]), False, True),
        (extend_batch([5, 3]), False, True),
        (extend_batch([5]), False, False),
        (decode_batch(3), True, False),
    ]
    for batch, decode_graph, prefill_graph in batches:
        backend.prepare_lora_batch(batch, [1] * batch.batch_size, SLOTS_RANKS, SCALINGS, decode_graph, prefill_graph)
        rows = batch.batch_size if decode_graph else sum(batch.extend_seq_lens_cpu)
        run_layer(backend, "with_base", torch.randn(rows, D_IN), a, b, offsets, torch.zeros(rows, offsets[-1]))
    assert streams == [side, None, side, "eager", side]


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_module_shapes_run_in_a_capture_get_their_eager_kernels_compiled_once(monkeypatch, impl):
    """A server whose forwards all replay graphs compiles each captured module shape's eager
    kernels at the first batch prepared outside a capture (SGLang's warm-up), once: the per-batch
    plans' and, where eager batches run kept plans (Triton), theirs over the eager static items."""
    import sglang_vlora.backend as backend_module
    from sglang_vlora.atmm import ops

    calls, kept = [], []
    monkeypatch.setattr(ops, "compile_eager", lambda x, a, b, items, offsets, out, impl: calls.append(
        (x.dtype, x.shape[1], a.data_ptr(), b.data_ptr(), offsets, out.shape[1], items.num_items)))
    monkeypatch.setattr(ops, "compile_kept", lambda x, a, b, items, offsets, out: kept.append(
        (x.shape[1], a.data_ptr(), b.data_ptr(), offsets, out.shape[1], items.max_tokens, items.paired)))
    capturing = [False]
    monkeypatch.setattr(backend_module, "_capturing", lambda device: capturing[0])
    slices = [12, 6, 6]
    a, b = pools(slices, seed=9)
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl=impl)
    assert backend.kept_plans == (impl == "triton")
    backend.init_prefill_cuda_graph_batch_info(max_num_tokens=16, max_num_requests=2)
    offsets = reference(torch.zeros(1, D_IN), a, b, [0], slices)[1]
    for capture in (False, True):  # a graph batch run outside a capture, then a capture
        backend.prepare_lora_batch(extend_batch([16]), [0], SLOTS_RANKS, SCALINGS, False, True)
        capturing[0] = capture
        run_layer(backend, "with_base", torch.randn(16, D_IN), a, b, offsets, torch.zeros(16, offsets[-1]))
    assert calls == []  # nothing compiled inside a capture
    backend.prepare_lora_batch(extend_batch([16]), [0], SLOTS_RANKS, SCALINGS, False, True)  # still capturing
    assert calls == []
    capturing[0] = False
    backend.prepare_lora_batch(extend_batch([5]), [1], SLOTS_RANKS, SCALINGS, False, False)
    assert calls == [(torch.float32, D_IN, a.data_ptr(), b.data_ptr(), offsets, offsets[-1], 1)]
    capturing[0] = True  # the shape captured again (another bucket): already compiled
    backend.prepare_lora_batch(extend_batch([16]), [0], SLOTS_RANKS, SCALINGS, False, True)
    run_layer(backend, "with_base", torch.randn(16, D_IN), a, b, offsets, torch.zeros(16, offsets[-1]))
    capturing[0] = False
    backend.prepare_lora_batch(extend_batch([5]), [1], SLOTS_RANKS, SCALINGS, False, False)
    assert len(calls) == 1
    # Both eager buffer sets where adapters may merge: one-layer items, and mixture's pairs.
    first_size = max(1024, VLoRAConfig().eager_in_gemm_max_tokens)  # the eager buffers' first size
    assert kept == [(D_IN, a.data_ptr(), b.data_ptr(), offsets, offsets[-1], first_size, paired)
                    for paired in (False, True)][: 2 * (impl == "triton")]


def test_a_captured_layer_with_appended_rows_gets_its_eager_in_gemm_expand_compiled(monkeypatch):
    """A layer with the pool's rows appended, run inside a capture: at the first batch prepared
    outside one, the in-GEMM expand of its shape is compiled for the eager batches too (over
    the eager static items, for the extended GEMM's rows), once; not with the limit 0."""
    import sglang_vlora.backend as backend_module
    from sglang_vlora.atmm import ops

    slices = [12, 6, 6]
    a, b, _, _, layer = stacked_layer(slices, seed=41)
    offsets = tuple(reference(torch.zeros(1, D_IN), a, b, [0], slices)[1])
    for limit, expected in ((16, 1), (0, 0)):
        calls = []
        monkeypatch.setattr(ops, "compile_eager", lambda *args: None)
        monkeypatch.setattr(ops, "compile_in_gemm", lambda x, rows, out, b_buffer, items, offs, calls=calls: calls.append(
            (x.shape[1], rows, out, b_buffer.data_ptr(), offs, items.covers_tokens, items.max_tokens, items.paired)))
        capturing = [True]
        monkeypatch.setattr(backend_module, "_capturing", lambda device, capturing=capturing: capturing[0])
        rt = VLoRARuntime(VLoRAConfig(eager_in_gemm_max_tokens=limit))
        backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), impl="torch",
                                  runtime=rt)
        backend.shrink_in_gemm = True
        backend.init_prefill_cuda_graph_batch_info(max_num_tokens=16, max_num_requests=2)
        backend.prepare_lora_batch(extend_batch([16]), [0], SLOTS_RANKS, SCALINGS, False, True)
        backend.forward_with_base(layer, torch.randn(16, D_IN), lambda: pytest.fail("base ran"), a, b, None, offsets)
        capturing[0] = False
        for _ in range(2):  # the second eager batch compiles nothing more
            backend.prepare_lora_batch(extend_batch([5]), [1], SLOTS_RANKS, SCALINGS, False, False)
        rows = offsets[-1] + a.shape[0] * a.shape[1]
        assert calls == [(D_IN, rows, offsets[-1], b.data_ptr(), list(offsets), True, 1024, paired)
                         for paired in (False, True)][: 2 * expected], limit


def test_eager_batches_run_the_lora_in_the_plugins_gemm(monkeypatch):
    """With ``--vlora-lora-gemm on`` an unmerged eager batch of at least the minimum tokens runs
    each layer with the appended-rows stack through ops.lora_apply_gemm (Triton's interpreter
    here): base + bias + LoRA in one call, SGLang's base GEMM not run; requests of one adapter
    apart from each other (the usual items would permute them), the no-adapter slot, mixed
    ranks, NaN past every rank. A merged adapter, a shorter batch or a layer without the stack
    take the usual path."""
    use_triton_interpreter(monkeypatch)
    slices = [256, 256, 256]  # inner offsets: multiples of the GEMM's tile columns
    a, b, w, bias, layer = stacked_layer(slices, seed=21)
    g = torch.Generator().manual_seed(22)
    rt = VLoRARuntime(VLoRAConfig(lora_gemm="on", lora_gemm_min_tokens=16))
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"), runtime=rt)
    backend.shrink_in_gemm = True
    offsets = tuple(reference(torch.zeros(1, D_IN), a, b, [0], slices)[1])
    seq_lens, slots = [5, 3, 7, 4, 2], [1, 3, 1, 0, 2]
    token_slots = [s for n, s in zip(seq_lens, slots, strict=True) for _ in range(n)]
    x = torch.randn(sum(seq_lens), D_IN, generator=g)
    expected = x.double() @ w.double().T + bias.double() + reference(x, a, b, token_slots, slices)[0]

    rt.controller = FakeController(None)
    backend.prepare_lora_batch(extend_batch(seq_lens), slots, SLOTS_RANKS, SCALINGS, use_cuda_graph=False)
    assert backend.gemm_items.permutation is None and backend.batches_by_layout["eager_lora_gemm"] == 0
    got = backend.forward_with_base(layer, x, lambda: pytest.fail("SGLang's base GEMM ran"), a, b, None, offsets)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)
    again = backend.forward_with_base(layer, x, lambda: pytest.fail("SGLang's base GEMM ran"), a, b, None, offsets)
    assert torch.equal(again, got) and backend.batches_by_layout["eager_lora_gemm"] == 1  # counted once a batch
    # A layer without the stack, in the same batch: SGLang's base GEMM, then ATMM's shrink and expand.
    plain = backend.forward_with_base(SimpleNamespace(), x, lambda: x @ w.T + bias, a, b, None, offsets)
    torch.testing.assert_close(plain.double(), expected, rtol=1e-4, atol=1e-4)

    for merged, tokens in ((2, sum(seq_lens)), (None, 15)):  # mixture; fewer tokens than the minimum
        rt.controller = FakeController(merged)
        lens = seq_lens if tokens == sum(seq_lens) else [15]
        backend.prepare_lora_batch(extend_batch(lens), slots[: len(lens)], SLOTS_RANKS, SCALINGS,
                                   use_cuda_graph=False)
        assert backend.gemm_items is None
    assert backend.batches_by_layout["eager_lora_gemm"] == 1
