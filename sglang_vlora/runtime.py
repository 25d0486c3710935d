"""The plugin's state in one SGLang process: one :class:`VLoRARuntime`.

:func:`sglang_vlora.plugin.register` (SGLang's plugin entry point, called once in every
process) creates it; the plugin hands it to the ``atmm`` backend (constructor argument) and
to every hook (bound as the hook function's first argument when the hook is registered).
Nothing else holds plugin state: hooks read and write the runtime, never module globals,
and never pass data to each other through attributes set on SGLang's objects.

SGLang serves from several processes; each has its own runtime, and only some parts of it
are ever filled in:

* every process: :attr:`~VLoRARuntime.config`, the options (``None`` until the plugin is
  turned on by ``--plugin vlora`` in the launcher, or by ``SGLANG_VLORA_CONFIG`` in the
  processes SGLang spawns);
* HTTP server (the launcher: FastAPI app, tokenizer manager): :attr:`~VLoRARuntime.rpc`,
  the client of the scheduler's RPC socket behind ``/vlora/mode`` and ``/vlora/status``,
  set once SGLang has launched the scheduler;
* scheduler (one per TP rank): :attr:`~VLoRARuntime.controller` (set when SGLang builds its
  LoRA manager), :attr:`~VLoRARuntime.orchestrator` (at the first scheduling step, unless
  ``--vlora-policy manual``), the task heads of loaded adapters and the head tasks of the
  forward batches in flight;
* detokenizer: the options only.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sglang_vlora.config import VLoRAConfig

if TYPE_CHECKING:
    from sglang_vlora.heads.task_head import TaskHead
    from sglang_vlora.http_api import SchedulerRPC
    from sglang_vlora.modes.controller import ModeController
    from sglang_vlora.orchestrator.runtime import Orchestrator


@dataclass(eq=False)
class VLoRARuntime:
    """Everything the plugin keeps in one process (see the module docstring for which
    parts exist in which process)."""

    config: VLoRAConfig | None = None
    # Scheduler: the mode controller over the LoRA-targeted base weights.
    controller: ModeController | None = None
    # Scheduler: the orchestrator (None with --vlora-policy manual).
    orchestrator: Orchestrator | None = None
    # HTTP server: the scheduler's RPC socket, for the /vlora routes.
    rpc: SchedulerRPC | None = None
    # Scheduler: the task heads of each loaded adapter, by SGLang's lora_id, then by task.
    heads: dict[str, dict[str, TaskHead]] = field(default_factory=dict)
    # Scheduler: per forward batch in flight (keyed by the id of its sampling info, which every
    # copy of the batch shares), the head task each request asked for.
    _head_tasks: dict[int, list[str | None]] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        """Whether the plugin is on in this process."""
        return self.config is not None

    def note_head_tasks(self, sampling_info: object, tasks: list[str | None] | None) -> None:
        """Remember the head task of each request of the forward batch that owns
        ``sampling_info`` (``None``: no request asks for a head). The note is dropped with
        ``sampling_info``, so a later object at the same address never sees it."""
        key = id(sampling_info)
        if tasks is None:
            self._head_tasks.pop(key, None)
            return
        if key not in self._head_tasks:
            weakref.finalize(sampling_info, self._head_tasks.pop, key, None)
        self._head_tasks[key] = tasks

    def head_tasks(self, sampling_info: object) -> list[str | None] | None:
        """The head tasks noted for the forward batch that owns ``sampling_info``."""
        if sampling_info is None:
            return None
        return self._head_tasks.get(id(sampling_info))
