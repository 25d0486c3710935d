"""SGLang plugin entry point (``sglang.srt.plugins`` -> ``vlora``).

SGLang calls :func:`register` in every process: the launcher (before it parses
arguments), the scheduler and the detokenizer (spawned; they import SGLang's engine
modules before calling plugins). The launcher learns from ``--plugin vlora`` whether
the plugin is on and hands our options to the children through the environment
(:mod:`sglang_vlora.config`); a child sees that variable and turns itself on.
"""

from __future__ import annotations

import argparse
import logging

from sglang_vlora import config as vlora_config
from sglang_vlora import cpu_compat, sglang_hooks

logger = logging.getLogger(__name__)

_active: vlora_config.VLoRAConfig | None = None


def register() -> None:
    """Entry point: add the flag hooks; in a child of an active launcher, turn on."""
    sglang_hooks.register(sglang_hooks.ARG_HOOKS)
    cfg = vlora_config.VLoRAConfig.from_env()
    if cfg is not None:
        activate(cfg)


def active_config() -> vlora_config.VLoRAConfig | None:
    """The options of this process if the plugin is on, else None."""
    return _active


def activate(cfg: vlora_config.VLoRAConfig) -> None:
    """Turn the plugin on in this process and check that every hook applied.

    Raises ``SystemExit`` naming the hook if one did not apply: SGLang's plugin
    loader catches ``Exception`` from plugins and would only log it.
    """
    global _active
    from sglang.srt.plugins.hook_registry import HookRegistry

    cpu_compat.activate()
    cfg.to_env()
    _register_backend()
    sglang_hooks.register(sglang_hooks.ACTIVE_HOOKS)
    HookRegistry.apply_hooks()
    try:
        sglang_hooks.verify_applied(sglang_hooks.ARG_HOOKS + sglang_hooks.ACTIVE_HOOKS)
    except RuntimeError as exc:
        logger.error("%s", exc)
        raise SystemExit(str(exc)) from exc
    _active = cfg
    logger.info("sglang-vlora active: %s", cfg)


def _register_backend() -> None:
    from sglang.srt.lora.backend.lora_registry import register_lora_backend

    @register_lora_backend("atmm")
    def create_atmm_backend():
        from sglang_vlora.backend import ATMMLoRABackend

        return ATMMLoRABackend


# Serving defaults on a machine without a GPU; applied only to flags left unset.
CPU_DEFAULTS = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "mm_attention_backend": "sdpa",
    "sampling_backend": "pytorch",
}


def _check_policy_fits(args: argparse.Namespace, cfg: vlora_config.VLoRAConfig) -> None:
    """Refuse, at launch, an orchestrator the server cannot run as asked."""
    if cfg.policy in ("manual", "unmerge-only"):
        return
    if args.lora_backend != "atmm":
        raise SystemExit(
            f"--vlora-policy {cfg.policy} merges adapters and needs --lora-backend atmm "
            f"(got {args.lora_backend}); use --vlora-policy unmerge-only or manual with other backends"
        )
    if (getattr(args, "pp_size", 1) or 1) > 1 or getattr(args, "enable_dp_attention", False):
        raise SystemExit(
            f"--vlora-policy {cfg.policy} supports tensor parallelism only (not pipeline parallelism "
            "or DP attention); use --vlora-policy manual"
        )


def apply_server_defaults(args: argparse.Namespace, cfg: vlora_config.VLoRAConfig) -> None:
    """LoRA on with backend ``atmm`` unless the user chose otherwise; CPU defaults
    when no GPU is present."""
    if args.enable_lora is None:
        args.enable_lora = True
    if args.lora_backend is None:
        args.lora_backend = "atmm"
    _check_policy_fits(args, cfg)
    if cpu_compat.gpu_present() or not cfg.cpu_defaults:
        return
    for name, value in CPU_DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    # CUDA graphs and overlap scheduling need a GPU.
    args.disable_overlap_schedule = True
    # An idle scheduler polls its sockets in a busy loop unless told to sleep: on a CPU
    # machine that takes most of a core per server doing nothing.
    args.sleep_on_idle = True
    if getattr(args, "cuda_graph_backend_decode", None) is None:
        args.cuda_graph_backend_decode = "disabled"
    if getattr(args, "cuda_graph_backend_prefill", None) is None:
        args.cuda_graph_backend_prefill = "disabled"
    if args.max_total_tokens is None:
        args.max_total_tokens = cfg.cpu_max_total_tokens
