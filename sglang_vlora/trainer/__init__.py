"""Accuracy-aware knowledge fusion (paper §4.2.1): train LoRA adapters (+ task heads) with
transformers + peft and pack many vision datasets into few adapters. Never imports SGLang.

Modules: ``data`` (tasks from packaged images), ``collect`` (label images with a small model),
``metrics``, ``learner`` (training / evaluation on a VLM), ``fusion`` (the greedy packing with
rollback, checkpoints, manifest), ``spec`` (tasks.yaml), ``cli`` (``vlora-fuse``),
``reference`` (the trainer's answers for a fusion output, for server tests).
"""
