"""ATMM: adaptive-tiling batched LoRA operators (paper §4.3).

Public API in :mod:`sglang_vlora.atmm.ops`; work items in
:mod:`sglang_vlora.atmm.work_items` and, for CUDA graphs,
:mod:`sglang_vlora.atmm.static_items`.
"""
