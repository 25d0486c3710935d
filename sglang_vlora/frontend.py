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
        self.head: bool | str = False

    def using(self, adapter: str | None, head: bool | str = False) -> VLoRAEndpoint:
        """The same endpoint, bound to ``adapter`` (``None`` for the base model).

        ``head=True`` (or a task name) asks the adapter's task head on every request:
        each ``sgl.gen`` then returns the head's label, computed from one forward pass.
        """
        if adapter is not None and (not isinstance(adapter, str) or not adapter):
            raise ValueError(f"adapter must be a non-empty name or None, got {adapter!r}")
        if head and adapter is None:
            raise ValueError("a task head belongs to an adapter: name the adapter")
        if not isinstance(head, (bool, str)):
            raise ValueError(f"head must be True, False or a task name, got {head!r}")
        view = copy.copy(self)
        view.adapter = adapter
        view.head = head
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
        if self.head:
            params = data.setdefault("sampling_params", {})
            params["custom_params"] = {**(params.get("custom_params") or {}), "vlora_head": self.head}

    def generate(self, s, sampling_params):
        comp, meta_info = super().generate(s, sampling_params)
        answers = (meta_info or {}).get("vlora_head") or []
        if self.head and answers and isinstance(answers[0], dict) and "label" in answers[0]:
            return answers[0]["label"], meta_info
        return comp, meta_info
