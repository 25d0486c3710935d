"""SGLang frontend helpers: pick the adapter per call.

SGLang 0.5.23's ``RuntimeEndpoint`` sends no ``lora_path``, so a frontend program
(``@sgl.function``) always runs on the base model. :class:`VLoRAEndpoint` names an
adapter on every request it sends; :meth:`VLoRAEndpoint.using` gives a view bound to
another adapter without a new connection, so one program can run per call on any
adapter::

    endpoint = VLoRAEndpoint("http://localhost:30000")
    state = multi_round_vqa.run(image_path="frame.png", questions=[...],
                                backend=endpoint.using("vqa"))
"""

from __future__ import annotations

import copy

from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint


class VLoRAEndpoint(RuntimeEndpoint):
    """A ``RuntimeEndpoint`` whose requests carry ``lora_path`` (None: base model)."""

    def __init__(self, base_url: str, adapter: str | None = None, **kwargs) -> None:
        super().__init__(base_url, **kwargs)
        self.adapter = adapter

    def using(self, adapter: str | None) -> VLoRAEndpoint:
        """The same endpoint, bound to ``adapter`` (``None`` for the base model)."""
        if adapter is not None and (not isinstance(adapter, str) or not adapter):
            raise ValueError(f"adapter must be a non-empty name or None, got {adapter!r}")
        view = copy.copy(self)
        view.adapter = adapter
        return view

    def _add_images(self, s, data: dict) -> None:
        # Every request path of RuntimeEndpoint (generate, stream, select, cache
        # fills) passes through here right before it is sent.
        super()._add_images(s, data)
        if self.adapter is None:
            return
        batch = data.get("text", data.get("input_ids"))
        if isinstance(batch, list) and batch and not isinstance(batch[0], int):
            data["lora_path"] = [self.adapter] * len(batch)
        else:
            data["lora_path"] = self.adapter
