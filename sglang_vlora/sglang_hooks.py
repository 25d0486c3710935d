"""Every SGLang function sglang-vlora wraps, in one place: target, kind, why, our side.

SGLang's ``HookRegistry`` only logs a hook whose target does not resolve, so
:func:`verify_applied` checks each of ours after ``apply_hooks`` and the plugin stops
with an error naming the hook that did not apply.

Two groups:

* :data:`ARG_HOOKS` are registered in every process, active or not, because the
  launcher must parse ``--plugin`` before it knows whether the plugin is on. Without
  ``--plugin vlora`` they only add our flags (and the ``atmm`` choice, which is
  refused without the plugin) and leave every SGLang option as SGLang resolves it.
* :data:`ACTIVE_HOOKS` are registered only when the plugin is on.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_vlora import config as vlora_config

logger = logging.getLogger(__name__)

SGLANG_DEFAULT_LORA_BACKEND = "csgmv"


@dataclass(frozen=True)
class Hook:
    target: str
    kind: HookType
    fn: Callable
    why: str


# --------------------------------------------------------------------- arg hooks
def add_cli_args_after(result, parser: argparse.ArgumentParser):
    """AFTER ``ServerArgs.add_cli_args``: our flags, ``atmm`` as a LoRA backend choice,
    and ``--lora-backend`` defaulting to "not given" so we can tell an explicit
    ``--lora-backend csgmv`` from SGLang's default."""
    vlora_config.add_cli_args(parser)
    for action in parser._actions:
        if action.dest == "lora_backend":
            action.choices = [*action.choices, "atmm"]
            action.default = None
    return result


def from_cli_args_around(original, cls, args: argparse.Namespace):
    """AROUND ``ServerArgs.from_cli_args``: turn the plugin on if ``--plugin vlora``
    was given (LoRA on, backend ``atmm`` unless another was chosen, CPU defaults),
    else restore SGLang's own default backend."""
    from sglang_vlora import plugin

    names = list(getattr(args, "plugin", []) or [])
    unknown = sorted(set(names) - {vlora_config.PLUGIN_NAME})
    if unknown:
        raise SystemExit(f"--plugin: unknown plugin(s) {unknown}; installed: ['{vlora_config.PLUGIN_NAME}']")
    if vlora_config.PLUGIN_NAME not in names:
        if args.lora_backend == "atmm":
            raise SystemExit("--lora-backend atmm needs --plugin vlora (the sglang-vlora plugin)")
        if args.lora_backend is None:
            args.lora_backend = SGLANG_DEFAULT_LORA_BACKEND
        return original(cls, args)
    try:
        cfg = vlora_config.VLoRAConfig.from_args(args)
    except ValueError as exc:
        raise SystemExit(f"sglang-vlora: {exc}") from exc
    plugin.activate(cfg)
    plugin.apply_server_defaults(args, cfg)
    return original(cls, args)


ARG_HOOKS = [
    Hook(
        "sglang.srt.server_args.ServerArgs.add_cli_args",
        HookType.AFTER,
        add_cli_args_after,
        "SGLang has no API for plugin flags: add --plugin and --vlora-*, offer 'atmm'.",
    ),
    Hook(
        "sglang.srt.server_args.ServerArgs.from_cli_args",
        HookType.AROUND,
        from_cli_args_around,
        "from_cli_args drops unknown fields: read ours here, turn the plugin on, "
        "fill LoRA and CPU defaults, and hand our options to children via the environment.",
    ),
]

async def validate_requests_around(original, self, obj) -> None:
    """AROUND ``TokenizerManager._validate_and_resolve_lora`` (launcher, every generate
    request): our checks first (input SGLang cannot serve, task-head and application / SLO
    fields), so a refused request holds no adapter reference; then SGLang's."""
    from sglang_vlora import guard_hooks
    from sglang_vlora.heads import head_hooks
    from sglang_vlora.orchestrator import scheduler_hooks

    guard_hooks.check_request(self, obj)
    head_hooks.check_head_requests(self, obj)
    scheduler_hooks.validate_application_and_slo(obj)
    await original(self, obj)


def _guard_hooks() -> list[Hook]:
    from sglang_vlora import guard_hooks

    common = "sglang.srt.utils.common"
    lora_manager = "sglang.srt.lora.lora_manager.LoRAManager"
    return [
        Hook(
            "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments",
            HookType.AFTER,
            guard_hooks.normalized_request_after,
            "a batch whose lora_path list is shorter than its prompts was a 500 (IndexError): a 400",
        ),
        Hook(
            "sglang.srt.entrypoints.api_contract.generate_contract_error",
            HookType.AROUND,
            guard_hooks.contract_error_around,
            "SGLang's /generate schema errors do not name the field: name it",
        ),
        Hook(
            f"{common}._load_image",
            HookType.AROUND,
            guard_hooks.load_image_around,
            "Pillow's decompression-bomb error on an image's header reached the client as a 500: a 400",
        ),
        Hook(
            f"{common}._fully_load_pil_image",
            HookType.AROUND,
            guard_hooks.image_size_around,
            "refuse (400) an image above --vlora-max-image-pixels before its pixels are decoded",
        ),
        Hook(
            "sglang.srt.utils.auth.decide_request_auth",
            HookType.AROUND,
            guard_hooks.decide_auth_around,
            "SGLang's auth levels have no 'any configured key' level: /vlora/status reads with either key",
        ),
        Hook(
            f"{lora_manager}._load_lora_adapter",
            HookType.AROUND,
            guard_hooks.check_adapter_load_around,
            "SGLang loads an adapter whose tensors do not fit the model (or hold NaN) and crashes on "
            "the first request that uses it: check the package first, a failed load says why",
        ),
        Hook(
            f"{lora_manager}._load_lora_adapter_from_tensors",
            HookType.AROUND,
            guard_hooks.check_tensor_load_around,
            "the same check for an adapter sent as tensors (/load_lora_adapter_from_tensors)",
        ),
        Hook(
            f"{lora_manager}.init_lora_shapes",
            HookType.AROUND,
            guard_hooks.served_targets_around,
            "--lora-target-modules all adds embed_tokens and lm_head, which atmm does not serve: "
            "serve the linear modules and say so instead of stopping at start",
        ),
    ]


def _head_hooks() -> list[Hook]:
    from sglang_vlora.heads import head_hooks

    lora_manager = "sglang.srt.lora.lora_manager.LoRAManager"
    return [
        Hook(
            "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_and_resolve_lora",
            HookType.AROUND,
            validate_requests_around,
            "refuse (400) input SGLang's scheduler would crash on (empty prompt, ids outside the "
            "vocabulary), head requests whose adapter has no such head and malformed application / "
            "SLO fields; finish head requests after prefill",
        ),
        Hook(
            f"{lora_manager}.validate_new_adapter",
            HookType.AFTER,
            head_hooks.load_heads_after_validate,
            "SGLang drops non-LoRA tensors from adapter files: load the task heads beside them, "
            "inside SGLang's load error handling so a bad head fails the load with its reason",
        ),
        Hook(
            f"{lora_manager}.load_lora_adapter",
            HookType.AFTER,
            head_hooks.drop_heads_after_load,
            "forget the heads of an adapter whose load failed",
        ),
        Hook(
            f"{lora_manager}.unload_lora_adapter",
            HookType.AFTER,
            head_hooks.drop_heads_after_unload,
            "forget the heads of an unloaded adapter",
        ),
        Hook(
            "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new",
            HookType.AFTER,
            head_hooks.mark_head_requests_after_init,
            "carry each request's head task from the schedule batch to the forward",
        ),
        Hook(
            "sglang.srt.layers.logits_processor.LogitsProcessor.forward",
            HookType.AROUND,
            head_hooks.logits_forward_around,
            "answer head requests from the last prompt token's final hidden state, in the same forward",
        ),
        Hook(
            "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info",
            HookType.AROUND,
            head_hooks.skip_empty_answers_around,
            "SGLang pads customized_info with nulls for every request of a batch that held a head "
            "request: only head requests get meta_info.vlora_head",
        ),
        Hook(
            "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._decode_response",
            HookType.AROUND,
            head_hooks.head_label_as_text_around,
            "OpenAI chat completions: a head answer's message text is its label",
        ),
    ]


def _mode_hooks() -> list[Hook]:
    from sglang_vlora.modes import mode_hooks

    lora = "sglang.srt.lora"
    return [
        Hook(
            f"{lora}.lora_manager.LoRAManager.__init__",
            HookType.AFTER,
            mode_hooks.lora_manager_init_after,
            "one mode controller per scheduler, over the LoRA-targeted base weights",
        ),
        Hook(
            f"{lora}.mem_pool.LoRAMemoryPool.prepare_lora_batch",
            HookType.BEFORE,
            mode_hooks.keep_merged_resident_before,
            "the merged adapter's pool slot feeds the mixture (-k) items: never evict it",
        ),
        Hook(
            f"{lora}.lora_manager.LoRAManager.validate_lora_batch",
            HookType.AROUND,
            mode_hooks.count_merged_around,
            "admission counts the merged adapter's pool slot, so the pool never runs out of slots",
        ),
        Hook(
            f"{lora}.lora_manager.LoRAManager.unload_lora_adapter",
            HookType.AROUND,
            mode_hooks.unload_around,
            "refuse to unload the merged adapter; forget the factors of an unloaded one",
        ),
        Hook(
            "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin._unload_lora_adapter_locked",
            HookType.AROUND,
            mode_hooks.refuse_unloading_merged_around,
            "refuse (400) to unload the merged adapter before SGLang forgets its name",
        ),
        Hook(
            "sglang.srt.managers.scheduler.Scheduler.__init__",
            HookType.AFTER,
            mode_hooks.bind_scheduler_after,
            "a merge may take a pool slot only if running requests do not hold them all: the "
            "controller reads the scheduler's running requests",
        ),
        Hook(
            "sglang.srt.managers.scheduler.Scheduler.handle_rpc_request",
            HookType.AROUND,
            mode_hooks.rpc_around,
            "mode changes and status reach every TP rank's scheduler between forward passes",
        ),
        Hook(
            "sglang.srt.entrypoints.engine.Engine._launch_subprocesses",
            HookType.AFTER,
            mode_hooks.launch_subprocesses_after,
            "the HTTP server has no API for new routes or the RPC socket: add /vlora/mode, /vlora/status",
        ),
    ]


def _orchestrator_hooks() -> list[Hook]:
    from sglang_vlora.orchestrator import scheduler_hooks

    scheduler = "sglang.srt.managers.scheduler.Scheduler"
    return [
        Hook(
            f"{scheduler}.get_next_batch_to_run",
            HookType.AROUND,
            scheduler_hooks.get_next_batch_around,
            "SGLang has no policy registry: decide mode and batch, and switch weights, "
            "between forward passes before SGLang picks the next batch",
        ),
        Hook(
            f"{scheduler}.can_schedule_lora_req",
            HookType.AROUND,
            scheduler_hooks.can_schedule_around,
            "admit only the waiting requests the policy chose",
        ),
        Hook(
            f"{scheduler}.run_batch",
            HookType.BEFORE,
            scheduler_hooks.run_batch_before,
            "count each batch under the mode it runs in and time it (measured cost model)",
        ),
    ]


ACTIVE_HOOKS: list[Hook] = _head_hooks() + _guard_hooks() + _mode_hooks() + _orchestrator_hooks()


# ------------------------------------------------------------------- machinery
def register(hooks: list[Hook]) -> None:
    for hook in hooks:
        HookRegistry.register(hook.target, hook.fn, hook.kind)


def _resolve(target: str):
    import pkgutil

    owner_path, attr = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else None
    if isinstance(raw, (classmethod, staticmethod)):
        return raw.__func__
    return getattr(owner, attr)


def _wraps_hook(fn: Callable, hook_fn: Callable) -> bool:
    """Walk the ``__wrapped__`` chain; true if a wrapper closes over ``hook_fn``."""
    seen = 0
    while fn is not None and seen < 32:
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook_fn:
                    return True
            except ValueError:
                continue
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return False


def verify_applied(hooks: list[Hook]) -> None:
    """Raise ``RuntimeError`` naming the first hook that is not in place."""
    for hook in hooks:
        try:
            current = _resolve(hook.target)
        except Exception as exc:  # the target does not exist in this SGLang
            raise RuntimeError(f"sglang-vlora: hook target {hook.target} not found ({exc})") from exc
        if not _wraps_hook(current, hook.fn):
            raise RuntimeError(
                f"sglang-vlora: hook {hook.kind.value} {hook.target} did not apply "
                f"(needed because: {hook.why})"
            )
