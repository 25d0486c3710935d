"""SGLang plugin entry point (``sglang.srt.plugins`` -> ``vlora``).

SGLang calls :func:`register` once in every process: the launcher (before it parses
arguments), the scheduler and the detokenizer (spawned; they import SGLang's engine
modules before calling plugins). :func:`register` creates the process's
:class:`~sglang_vlora.runtime.VLoRARuntime`, the one object that holds the plugin's state,
and registers the argument hooks. The launcher learns from ``--plugin vlora`` whether the
plugin is on and hands our options to the children through the environment
(:mod:`sglang_vlora.config`); a child sees that variable and turns itself on.
"""

from __future__ import annotations

import argparse
import functools
import logging
from typing import NoReturn

from sglang_vlora import config as vlora_config
from sglang_vlora import cpu_compat, sglang_hooks, touch_points
from sglang_vlora.runtime import VLoRARuntime

logger = logging.getLogger(__name__)


def register() -> None:
    """Entry point: create this process's runtime and add the flag hooks; in a child of an
    active launcher, turn on."""
    rt = VLoRARuntime()
    touch_points.register(sglang_hooks.ARG_HOOKS, functools.partial(turn_on_from_args, rt))
    cfg = vlora_config.VLoRAConfig.from_env()
    if cfg is not None:
        activate(rt, cfg)


def turn_on_from_args(rt: VLoRARuntime, args: argparse.Namespace) -> None:
    """``--plugin vlora`` was given (launcher): read our flags, turn on, fill SGLang's
    LoRA and CPU defaults."""
    try:
        cfg = vlora_config.VLoRAConfig.from_args(args)
        # read again where the kernels launch; a bad value is refused here, at launch, first
        vlora_config.direct_launch_setting()
        vlora_config.pdl_setting()
    except ValueError as exc:
        raise SystemExit(f"sglang-vlora: {exc}") from exc
    activate(rt, cfg)
    apply_server_defaults(args, cfg)


def _stop(exc: Exception) -> NoReturn:
    """SGLang's plugin loader catches ``Exception`` from plugins and would only log it."""
    logger.error("%s", exc)
    raise SystemExit(str(exc)) from exc


def activate(rt: VLoRARuntime, cfg: vlora_config.VLoRAConfig) -> None:
    """Turn the plugin on in this process: check the installed SGLang against the touch-point
    table, register the ``atmm`` backend and the hooks (bound to ``rt``), check that every
    hook applied. A second call (the launcher of a child's environment) only replaces the
    options. Raises ``SystemExit`` naming what moved or the hook that did not apply."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    hooks = sglang_hooks.ARG_HOOKS + sglang_hooks.ACTIVE_HOOKS
    try:
        touch_points.check([], sglang_hooks.CPU_BRIDGE_POINTS)
        cpu_compat.activate()
        if not rt.active:
            touch_points.check(hooks, sglang_hooks.SERVER_POINTS)
    except touch_points.SGLangMismatch as exc:
        _stop(exc)
    cfg.to_env()
    if not rt.active:
        _register_backend(rt)
        touch_points.register(sglang_hooks.ACTIVE_HOOKS, rt)
        HookRegistry.apply_hooks()
    try:
        touch_points.verify_applied(hooks)
    except RuntimeError as exc:
        _stop(exc)
    rt.config = cfg
    logger.info("sglang-vlora active: %s", cfg)


def _register_backend(rt: VLoRARuntime) -> None:
    from sglang.srt.lora.backend.lora_registry import register_lora_backend

    @register_lora_backend("atmm")
    def create_atmm_backend():
        from sglang_vlora.backend import ATMMLoRABackend

        return functools.partial(ATMMLoRABackend, runtime=rt)


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
