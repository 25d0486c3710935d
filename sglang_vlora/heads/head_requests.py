"""What a request asks of a task head and what it gets back (paper §4.2.2), over plain values.

A request asks for its adapter's head with ``sampling_params.custom_params =
{"vlora_head": true}`` (or the task name when the adapter carries several heads);
``custom_params`` is the field SGLang carries unchanged from the HTTP request to the
scheduler. The HTTP server checks the request (:func:`check_head_request`: it names an
adapter that has that head) and makes it finish after prefill; the scheduler answers it from
the last prompt token's final hidden state (:func:`head_answer`), and the answer reaches the
response's ``meta_info["vlora_head"]`` (:data:`RESULT_KEY`). The hooks that do this inside
SGLang are in :mod:`sglang_vlora.heads.head_hooks` and :mod:`sglang_vlora.guard_hooks`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sglang_vlora.adapters import read_head_config
from sglang_vlora.heads.task_head import TaskHead

HEAD_PARAM = "vlora_head"
RESULT_KEY = "vlora_head"
TOP_K = 5


def requested_task(custom_params: dict | None) -> str | None:
    """``None``: no head asked for; ``""``: the adapter's only head; else a task name.

    Raises ``ValueError`` for a malformed field (the HTTP server answers 400 with it)."""
    if custom_params is None:
        return None
    if not isinstance(custom_params, dict):
        raise ValueError(f"custom_params must be an object such as {{\"{HEAD_PARAM}\": true}}, got {type(custom_params).__name__}")
    value = custom_params.get(HEAD_PARAM)
    if value is None or value is False:
        return None
    if value is True:
        return ""
    if isinstance(value, str) and value:
        return value
    raise ValueError(f"custom_params.{HEAD_PARAM} must be true or a task name, got {value!r}")


def openai_head_refusal(endpoint: str, stream: bool, custom_params: Any) -> str | None:
    """Why an OpenAI-API request for a head answer cannot get it, or None. The answer reaches
    a client as the message text of a chat completion that is not streamed (and in
    ``meta_info``); a streamed chat completion and a text completion would carry the language
    model's one token instead, which is not the answer. A malformed field is left to
    :func:`requested_task`'s check in the tokenizer."""
    try:
        if requested_task(custom_params) is None:
            return None
    except ValueError:
        return None
    if endpoint == "completions":
        return (f"custom_params.{HEAD_PARAM}: a text completion cannot carry a head's answer; use "
                "/v1/chat/completions (the label is the message text) or /generate (meta_info.vlora_head)")
    if stream:
        return (f"custom_params.{HEAD_PARAM}: a streamed chat completion cannot carry a head's answer; "
                "send stream=false (the label is the message text) or use /generate, whose stream carries "
                "it in meta_info.vlora_head")
    return None


def scheduler_task(custom_params: Any) -> str | None:
    """:func:`requested_task` in the scheduler, where a raise would stop the server: the
    HTTP server refused malformed fields already, so one here asks for no head."""
    try:
        return requested_task(custom_params)
    except ValueError:
        return None


def choose_head(heads: dict[str, Any], task: str, adapter: str) -> Any:
    """The head (or head config entry) of ``heads`` that ``task`` asks for; ``ValueError`` with
    the reason when there is none."""
    if not heads:
        raise ValueError(f"adapter {adapter!r} has no task head")
    if task:
        if task not in heads:
            raise ValueError(f"adapter {adapter!r} has no head for task {task!r} (heads: {sorted(heads)})")
        return heads[task]
    if len(heads) > 1:
        raise ValueError(f"adapter {adapter!r} has heads {sorted(heads)}: name one in custom_params.{HEAD_PARAM}")
    return next(iter(heads.values()))


def check_head_request(params: dict, adapter: str | None, lora_path_of: Callable[[str], str | None]) -> None:
    """One request's sampling params and adapter, in the HTTP server: refuse a head request whose
    adapter has no such head (``ValueError``: a 400 with the reason) and make a valid one finish
    after prefill. ``lora_path_of`` gives the folder of an adapter the server knows (None: an
    unknown adapter, left to SGLang's own error)."""
    task = requested_task(params.get("custom_params"))
    if task is None:
        return
    if not adapter:
        raise ValueError(f"custom_params.{HEAD_PARAM} needs an adapter (lora_path): heads belong to adapters")
    lora_path = lora_path_of(adapter)
    if lora_path is None:
        return
    config = read_head_config(lora_path)
    tasks = {entry["task"]: entry for entry in (config or {}).get("heads", [])}
    choose_head(tasks, task, adapter)  # raises with the reason
    params["max_new_tokens"] = 1


def head_answer(head: TaskHead, hidden: torch.Tensor) -> dict[str, Any]:
    """Label and top-k probabilities for one last-token hidden state ``[hidden]``."""
    with torch.no_grad():
        probs = torch.softmax(head(hidden.unsqueeze(0)).float(), dim=-1)[0]
    k = min(TOP_K, probs.numel())
    values, indices = probs.topk(k)
    labels = head.spec.labels
    return {
        "task": head.spec.task,
        "label": labels[int(indices[0])],
        "top_k": [{"label": labels[int(i)], "prob": float(p)} for p, i in zip(values, indices, strict=True)],
    }
