"""Hooks on SGLang's argument parsing, registered in every process whether the plugin is on
or not (the launcher must parse ``--plugin`` before it knows). Declared, with their reasons,
in :mod:`sglang_vlora.sglang_hooks`; each takes first the plugin's ``turn_on`` callable
(:func:`sglang_vlora.plugin.turn_on_from_args` bound to the process's runtime), which turns
the plugin on from the parsed flags.

Without ``--plugin vlora`` they only add our flags (and the ``atmm`` choice, which is
refused without the plugin) and leave every SGLang option as SGLang resolves it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from sglang_vlora import config as vlora_config

TurnOn = Callable[[argparse.Namespace], None]


def _sglang_default_lora_backend() -> str:
    """The ``--lora-backend`` SGLang picks when none is given (its ``ServerArgs`` default)."""
    import msgspec
    from sglang.srt.server_args import ServerArgs

    return next(f.default for f in msgspec.structs.fields(ServerArgs) if f.name == "lora_backend")


def add_cli_args_after(turn_on: TurnOn, result, parser: argparse.ArgumentParser):
    """AFTER ``ServerArgs.add_cli_args``: our flags, ``atmm`` as a LoRA backend choice,
    and ``--lora-backend`` defaulting to "not given" so we can tell an explicit
    ``--lora-backend csgmv`` from SGLang's default."""
    vlora_config.add_cli_args(parser)
    for action in parser._actions:
        if action.dest == "lora_backend":
            action.choices = [*action.choices, "atmm"]
            action.default = None
    return result


def from_cli_args_around(turn_on: TurnOn, original, cls, args: argparse.Namespace):
    """AROUND ``ServerArgs.from_cli_args``: turn the plugin on if ``--plugin vlora``
    was given (LoRA on, backend ``atmm`` unless another was chosen, CPU defaults),
    else restore SGLang's own default backend."""
    names = list(getattr(args, "plugin", []) or [])
    unknown = sorted(set(names) - {vlora_config.PLUGIN_NAME})
    if unknown:
        raise SystemExit(f"--plugin: unknown plugin(s) {unknown}; installed: ['{vlora_config.PLUGIN_NAME}']")
    if vlora_config.PLUGIN_NAME not in names:
        if args.lora_backend == "atmm":
            raise SystemExit("--lora-backend atmm needs --plugin vlora (the sglang-vlora plugin)")
        if args.lora_backend is None:
            args.lora_backend = _sglang_default_lora_backend()
        return original(cls, args)
    turn_on(args)
    return original(cls, args)
