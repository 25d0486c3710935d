"""Swift mode switcher: fold one adapter's LoRA delta into the base weights of every
layer in one shot, unfold it, and switch between adapters (paper §4.4.1).

Layout. The base weights of one *module kind* (``q``, ``o``, ``gate``, ...) across
all layers should live in one ``[L, out, in]`` stack whose per-layer views the model
uses (:func:`stack_in_place` rebinds existing parameters that way). Then one kernel
updates every layer of the kind: on CUDA the ``fold`` path (one Triton kernel, one
pass over the weights, :mod:`.fold_kernel`), elsewhere the ``batched`` path (one
in-place ``baddbmm_``). A kind given as per-layer tensors that are not evenly spaced
views of one storage takes the ``loop`` path (one ``addmm_`` per layer);
:attr:`SwiftSwitcher.paths` says which path each kind takes. A fused projection
(``qkv_proj``, ``gate_up_proj``) is split into one kind per slice with
:func:`slice_kinds`: strided views of the same stack, so no copy.

Exactness. In bf16, ``W + dW - dW != W`` (one merge/unmerge cycle changes about 11% of
the elements), so with ``exact=True`` (the default) the switcher keeps a pristine
copy ``W0`` of every targeted weight and never derives the base from a merged
weight: unmerge is ``W <- W0`` (a copy), merge of ``b`` is ``W <- W0 + s_b B_b A_b``
(fp32 accumulation, one rounding), and a switch ``a -> b`` is the same as a merge of
``b``, so ``a``'s delta is never subtracted. Base weights are bit-identical to the
originals after any sequence of operations, and merged weights carry one rounding
whatever the history. On the ``fold`` path every operation is one pass over the
weights (read ``W0``, write ``W``), the same bytes as an in-place update; on the
``batched`` path a switch is a ``copy_`` then a ``baddbmm_``. The cost is one extra
copy of the targeted weights, on the weights' device (fast) or in host memory
(``pristine_device="cpu"``: frees device memory, each switch then moves the weights
over PCIe).

With ``exact=False`` no copy is kept and everything is in place: merge
``W += s B A``, unmerge ``W -= s B A``, and the fused switch ``W += [s_b B_b,
-s_a B_a] [A_b; A_a]`` in one pass (one batched GEMM of rank ``r_a + r_b``). Rounding
errors accumulate with every switch: use it only where the memory of the copy
matters more than exact weights.

Only torch is imported: the benchmark and tests use this module without SGLang.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

Path = Literal["fold", "batched", "loop"]
Kernel = Literal["auto", "torch", "triton"]


@dataclass(frozen=True)
class LoRADelta:
    """One adapter's LoRA factors for one module kind, all layers:
    ``delta[l] = scaling * b[l] @ a[l]`` with ``a`` ``[L, r, in]``, ``b`` ``[L, out, r]``."""

    a: torch.Tensor
    b: torch.Tensor
    scaling: float

    @property
    def rank(self) -> int:
        return self.a.shape[1]


@torch.no_grad()
def stack_in_place(weights: Sequence[torch.Tensor], extra_rows: int = 0) -> torch.Tensor:
    """Copy per-layer weights (same shape, dtype, device) into one ``[L, out + extra_rows,
    in]`` stack and rebind each tensor's ``.data`` to its view of the stack (its first
    ``out`` rows); returns the stack. The ``extra_rows`` after each layer's weight are zero:
    room for the rows a GEMM over the whole layer appends (:mod:`sglang_vlora.in_gemm_weights`).

    Rebinding keeps the ``nn.Parameter`` objects the model holds, so call it once at
    load time, before anything (a CUDA graph, an optimizer) has captured the old
    storage. Peak extra memory: the stack, until the old storages are freed.
    """
    if not weights:
        raise ValueError("no weights to stack")
    first = weights[0]
    for w in weights:
        if w.shape != first.shape or w.dtype != first.dtype or w.device != first.device:
            raise ValueError("weights of one kind must share shape, dtype and device")
    if extra_rows < 0:
        raise ValueError(f"extra_rows must be >= 0, got {extra_rows}")
    rows = first.shape[0]
    stack = torch.empty((len(weights), rows + extra_rows, *first.shape[1:]), dtype=first.dtype, device=first.device)
    stack[:, rows:].zero_()
    for i, w in enumerate(weights):
        stack[i, :rows].copy_(w)
        w.data = stack[i, :rows]
    return stack


def slice_kinds(stack: torch.Tensor, names: Sequence[str], offsets: Sequence[int]) -> dict[str, torch.Tensor]:
    """Split a fused ``[L, out_total, in]`` stack (qkv, gate_up) into per-slice views
    ``stack[:, offsets[s]:offsets[s + 1]]``, one kind per slice (no copy)."""
    if len(offsets) != len(names) + 1 or offsets[-1] != stack.shape[1]:
        raise ValueError(f"offsets {list(offsets)} do not split {stack.shape[1]} rows into {list(names)}")
    return {name: stack[:, offsets[s] : offsets[s + 1]] for s, name in enumerate(names)}


def deltas_from_pool(
    a_buffers: Sequence[torch.Tensor],
    b_buffers: Sequence[torch.Tensor],
    slot: int,
    rank: int,
    slice_offsets: Sequence[int],
    scaling: float,
) -> list[LoRADelta]:
    """One :class:`LoRADelta` per slice from SGLang-layout memory pools, one pool pair
    per layer: ``A[slot, S * max_rank, in]`` (slice ``s`` at rows ``[s r, (s + 1) r)``),
    ``B[slot, out_total, max_rank]`` (slice ``s`` at rows ``slice_offsets[s:s + 2]``,
    columns ``[:r]``). The factors are copied, so later pool reuse does not change a
    registered adapter."""
    deltas = []
    for s in range(len(slice_offsets) - 1):
        lo, hi = slice_offsets[s], slice_offsets[s + 1]
        a = torch.stack([buf[slot, s * rank : (s + 1) * rank] for buf in a_buffers])
        b = torch.stack([buf[slot, lo:hi, :rank] for buf in b_buffers])
        deltas.append(LoRADelta(a=a, b=b, scaling=scaling))
    return deltas


def _as_stack(weights: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor | None:
    """A ``[L, out, in]`` view covering all layers, or None when the layers are not
    evenly spaced, equally strided views of one storage."""
    if isinstance(weights, torch.Tensor):
        if weights.dim() != 3:
            raise ValueError(f"a stacked kind must be [L, out, in], got {tuple(weights.shape)}")
        return weights
    first = weights[0]
    if len(weights) == 1:
        return first.unsqueeze(0)
    step = weights[1].storage_offset() - first.storage_offset()
    ptr = first.untyped_storage().data_ptr()
    for i, w in enumerate(weights):
        if (
            w.shape != first.shape
            or w.stride() != first.stride()
            or w.dtype != first.dtype
            or w.untyped_storage().data_ptr() != ptr
            or w.storage_offset() != first.storage_offset() + i * step
        ):
            return None
    if step <= 0:
        return None
    return first.as_strided((len(weights), *first.shape), (step, *first.stride()), first.storage_offset())


class _Kind:
    """One module kind: the live weights, the pristine copy and the fold operators."""

    def __init__(
        self,
        name: str,
        weights: torch.Tensor | Sequence[torch.Tensor],
        pristine_device: torch.device | None,
        kernel: Kernel,
    ):
        if not isinstance(weights, torch.Tensor) and not weights:
            raise ValueError(f"kind {name!r} has no layers")
        self.name = name
        # detached views share the storage but keep autograd out (Parameters need it)
        weights = weights.detach() if isinstance(weights, torch.Tensor) else [w.detach() for w in weights]
        self.stack = _as_stack(weights)
        self.layers: list[torch.Tensor] = list(self.stack.unbind(0) if self.stack is not None else weights)
        first = self.layers[0]
        for w in self.layers:
            if w.dim() != 2 or w.shape != first.shape or w.dtype != first.dtype or w.device != first.device:
                raise ValueError(f"kind {name!r}: layers must be 2-D with one shape, dtype and device")
        self.shape = tuple(first.shape)
        self.dtype = first.dtype
        self.device = first.device
        self.pristine: torch.Tensor | None = None
        if pristine_device is not None:
            pin = pristine_device.type == "cpu" and self.device.type == "cuda"
            self.pristine = torch.empty(
                (len(self.layers), *self.shape), dtype=self.dtype, device=pristine_device, pin_memory=pin
            )
            for i, w in enumerate(self.layers):
                self.pristine[i].copy_(w)
        use_triton = kernel == "triton" or (kernel == "auto" and self.device.type == "cuda")
        pristine_here = self.pristine is None or self.pristine.device == self.device
        self.path: Path = "loop"
        if self.stack is not None:
            self.path = "fold" if use_triton and pristine_here else "batched"

    @property
    def pristine_bytes(self) -> int:
        return 0 if self.pristine is None else self.pristine.numel() * self.pristine.element_size()

    def check(self, delta: LoRADelta) -> None:
        n, (out, inp) = len(self.layers), self.shape
        if delta.a.shape[0] != n or delta.a.shape[2] != inp or tuple(delta.b.shape) != (n, out, delta.rank):
            raise ValueError(
                f"kind {self.name!r}: expected a [{n}, r, {inp}] and b [{n}, {out}, r], "
                f"got {tuple(delta.a.shape)} and {tuple(delta.b.shape)}"
            )

    def restore(self) -> None:
        """``W <- W0``: bit-exact, no arithmetic."""
        assert self.pristine is not None
        if self.path == "fold":
            from sglang_vlora.modes.fold_kernel import copy_stack

            copy_stack(self.stack, self.pristine)
        elif self.stack is not None:
            self.stack.copy_(self.pristine, non_blocking=True)
        else:
            for w, p in zip(self.layers, self.pristine, strict=True):
                w.copy_(p, non_blocking=True)

    def add(self, b: torch.Tensor, a: torch.Tensor, alpha: float, from_pristine: bool = False) -> None:
        """``W[l] = (W0[l] if from_pristine else W[l]) + alpha * b[l] @ a[l]`` for all
        layers, in place: one pass on the ``fold`` path, copy then GEMM otherwise."""
        if self.path == "fold":
            from sglang_vlora.modes.fold_kernel import fold

            fold(self.stack, self.pristine if from_pristine else self.stack, b, a, alpha)
            return
        if from_pristine:
            self.restore()
        if self.stack is not None:
            self.stack.baddbmm_(b, a, alpha=alpha)
        else:
            for w, bl, al in zip(self.layers, b, a, strict=True):
                w.addmm_(bl, al, alpha=alpha)


class SwiftSwitcher:
    """Merge, unmerge and switch LoRA adapters over the base weights of many kinds.

    ``kinds`` maps a kind name to its base weights: a ``[L, out, in]`` stack (or a view
    of one) or a list of per-layer ``[out, in]`` tensors. The weights are updated in
    place (their storage never moves, so CUDA graphs that read them stay valid).
    ``pristine_device`` (exact mode only) is where the pristine copy lives; default:
    the weights' device. ``kernel``: ``auto`` takes the one-pass Triton fold
    (:mod:`.fold_kernel`) for stacked kinds on CUDA and torch's ``baddbmm_``
    elsewhere; ``torch`` / ``triton`` force one (``triton`` on CPU needs
    ``TRITON_INTERPRET=1``).
    """

    def __init__(
        self,
        kinds: Mapping[str, torch.Tensor | Sequence[torch.Tensor]],
        exact: bool = True,
        pristine_device: torch.device | str | None = None,
        kernel: Kernel = "auto",
    ):
        if not kinds:
            raise ValueError("no module kinds")
        if not exact and pristine_device is not None:
            raise ValueError("pristine_device only applies to exact=True")
        self.exact = exact
        self._kinds: dict[str, _Kind] = {}
        for name, weights in kinds.items():
            device = None
            if exact:
                first = weights if isinstance(weights, torch.Tensor) else weights[0]
                device = torch.device(pristine_device) if pristine_device is not None else first.device
            self._kinds[name] = _Kind(name, weights, device, kernel)
        self._adapters: dict[str, dict[str, LoRADelta]] = {}
        self.merged: str | None = None
        self.switch_count = 0

    # ------------------------------------------------------------------ adapters
    def add_adapter(self, name: str, deltas: Mapping[str, LoRADelta]) -> None:
        """Register an adapter's factors per kind (kinds it does not target are left
        out). Factors are cast to the weights' dtype and device."""
        if name in self._adapters:
            raise ValueError(f"adapter {name!r} is already registered")
        unknown = sorted(set(deltas) - set(self._kinds))
        if unknown:
            raise ValueError(f"adapter {name!r}: unknown kinds {unknown}")
        stored = {}
        for kind_name, delta in deltas.items():
            kind = self._kinds[kind_name]
            kind.check(delta)
            stored[kind_name] = LoRADelta(
                a=delta.a.detach().to(kind.device, kind.dtype).contiguous(),
                b=delta.b.detach().to(kind.device, kind.dtype).contiguous(),
                scaling=float(delta.scaling),
            )
        self._adapters[name] = stored

    def remove_adapter(self, name: str) -> None:
        if name == self.merged:
            raise ValueError(f"adapter {name!r} is merged; unmerge or switch first")
        del self._adapters[name]

    @property
    def adapters(self) -> list[str]:
        return list(self._adapters)

    # ------------------------------------------------------------------ state
    @property
    def paths(self) -> dict[str, Path]:
        """Per kind: ``fold`` (one Triton kernel over all layers, one pass over the
        weights), ``batched`` (one ``baddbmm_`` over all layers, after a ``copy_`` from
        the pristine copy when exact) or ``loop`` (per-layer ``addmm_``)."""
        return {name: kind.path for name, kind in self._kinds.items()}

    @property
    def pristine_bytes(self) -> int:
        """Memory held by the exact scheme (0 with ``exact=False``)."""
        return sum(kind.pristine_bytes for kind in self._kinds.values())

    # ------------------------------------------------------------------ operations
    def merge(self, name: str) -> None:
        """Fold adapter ``name`` into the weights; from another merged adapter this is
        a switch (one pass over the weights on the ``fold`` path or when inexact)."""
        if name not in self._adapters:
            raise KeyError(f"unknown adapter {name!r}")
        self._go(name)

    def unmerge(self) -> None:
        """Back to the base weights (bit-identical to the originals when exact)."""
        self._go(None)

    def switch(self, name: str | None) -> None:
        """Go to adapter ``name`` merged, or to the base weights for None."""
        if name is None:
            self.unmerge()
        else:
            self.merge(name)

    def _go(self, target: str | None) -> None:
        source = self.merged
        if target == source:
            return
        for kind_name, kind in self._kinds.items():
            old = self._adapters[source].get(kind_name) if source is not None else None
            new = self._adapters[target].get(kind_name) if target is not None else None
            if self.exact:
                if new is not None:
                    kind.add(new.b, new.a, new.scaling, from_pristine=old is not None)
                elif old is not None:
                    kind.restore()
            elif old is not None and new is not None:
                b = torch.cat([new.b * new.scaling, old.b * -old.scaling], dim=2)
                a = torch.cat([new.a, old.a], dim=1)
                kind.add(b, a, 1.0)
            elif old is not None:
                kind.add(old.b, old.a, -old.scaling)
            elif new is not None:
                kind.add(new.b, new.a, new.scaling)
        self.merged = target
        self.switch_count += 1
