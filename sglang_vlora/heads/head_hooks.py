"""Task-head inference inside SGLang: the glue between SGLang's request path and
:mod:`sglang_vlora.heads.task_head`. Declared in :mod:`sglang_vlora.sglang_hooks`.

A request asks for its adapter's head with ``sampling_params.custom_params =
{"vlora_head": true}`` (or the task name when the adapter carries several heads);
``custom_params`` is the field SGLang carries unchanged from the HTTP request to the
scheduler. Then:

1. launcher: the request is checked (it names an adapter that has that head) and its
   ``max_new_tokens`` set to 1, so it finishes after prefill;
2. scheduler, adapter load: the adapter's heads are loaded beside its LoRA weights
   (SGLang drops non-LoRA tensors from adapter files) and checked against the model's
   hidden size; a mismatch fails the load with the reason;
3. scheduler, forward: after the logits, each head request's last prompt token's final
   hidden state goes through the head; label and top-k probabilities ride in the
   logits output's ``customized_info`` and reach the response's
   ``meta_info["vlora_head"]``;
4. OpenAI chat completions: the label is the message text (non-streaming), and the
   structured answer is in ``choices[].meta_info`` when ``return_meta_info`` is set.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from sglang_vlora.adapters import load_heads, read_head_config
from sglang_vlora.heads.task_head import TaskHead

logger = logging.getLogger(__name__)

HEAD_PARAM = "vlora_head"
RESULT_KEY = "vlora_head"
TOP_K = 5

# Scheduler process: heads of loaded adapters, by SGLang's lora_id.
_heads_by_lora_id: dict[str, dict[str, TaskHead]] = {}


def requested_task(custom_params: dict | None) -> str | None:
    """``None``: no head asked for; ``""``: the adapter's only head; else a task name.

    Raises ``ValueError`` for a malformed field (the launcher answers 400 with it)."""
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


def _scheduler_task(custom_params) -> str | None:
    """:func:`requested_task` in the scheduler, where a raise would stop the server: the
    launcher refused malformed fields already, so one here asks for no head."""
    try:
        return requested_task(custom_params)
    except ValueError:
        return None


def choose_head(heads: dict[str, TaskHead], task: str, adapter: str) -> TaskHead:
    if not heads:
        raise ValueError(f"adapter {adapter!r} has no task head")
    if task:
        if task not in heads:
            raise ValueError(f"adapter {adapter!r} has no head for task {task!r} (heads: {sorted(heads)})")
        return heads[task]
    if len(heads) > 1:
        raise ValueError(f"adapter {adapter!r} has heads {sorted(heads)}: name one in custom_params.{HEAD_PARAM}")
    return next(iter(heads.values()))


# ------------------------------------------------------------------- launcher
def _per_request(obj) -> list[tuple[dict, str | None]]:
    """(sampling params dict, adapter name) of each request of a GenerateReqInput."""
    texts = obj.text if obj.text is not None else obj.input_ids
    batch = isinstance(texts, list) and texts and not isinstance(texts[0], int)
    n = len(texts) if batch else 1
    params = obj.sampling_params
    if params is None:
        params = {}
        obj.sampling_params = params
    param_list = params if isinstance(params, list) else [params] * n
    adapters = obj.lora_path if isinstance(obj.lora_path, list) else [obj.lora_path] * n
    return list(zip(param_list, adapters, strict=False))


def check_head_requests(tokenizer_manager, obj) -> None:
    """Launcher, before SGLang resolves the adapters: refuse head requests whose adapter has
    no such head (``ValueError``: a 400 with the reason) and make the valid ones finish after
    prefill. An adapter SGLang does not know is left to SGLang's own error."""
    for params, adapter in _per_request(obj):
        if not isinstance(params, dict):
            continue
        task = requested_task(params.get("custom_params"))
        if task is None:
            continue
        if not adapter:
            raise ValueError(f"custom_params.{HEAD_PARAM} needs an adapter (lora_path): heads belong to adapters")
        ref = tokenizer_manager.lora_registry._registry.get(adapter) or tokenizer_manager.lora_ref_cache.get(adapter)
        if ref is None:
            continue
        config = read_head_config(ref.lora_path)
        tasks = {entry["task"]: entry for entry in (config or {}).get("heads", [])}
        choose_head(tasks, task, adapter)  # raises with the reason
        params["max_new_tokens"] = 1


# ------------------------------------------------------------------ scheduler
def _text_hidden_size(hf_config) -> int:
    text_config = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    return int(text_config.hidden_size)


def load_heads_after_validate(result, self, lora_config, lora_ref) -> None:
    """AFTER ``LoRAManager.validate_new_adapter`` (inside SGLang's load ``try``):
    load and check the adapter's heads, so a bad head fails the load with its reason."""
    heads = load_heads(lora_ref.lora_path, _text_hidden_size(self.base_hf_config))
    device = self.device
    dtype = torch.float32
    _heads_by_lora_id[lora_ref.lora_id] = {task: head.to(device=device, dtype=dtype) for task, head in heads.items()}
    if heads:
        logger.info("sglang-vlora: adapter %s carries heads %s", lora_ref.lora_name, sorted(heads))
    return result


def drop_heads_after_load(result, self, lora_ref):
    """AFTER ``LoRAManager.load_lora_adapter``: forget heads of a load that failed."""
    if not getattr(result, "success", False):
        _heads_by_lora_id.pop(lora_ref.lora_id, None)
    return result


def drop_heads_after_unload(result, self, lora_ref):
    """AFTER ``LoRAManager.unload_lora_adapter``."""
    if getattr(result, "success", False):
        _heads_by_lora_id.pop(lora_ref.lora_id, None)
    return result


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


HEAD_TASKS_ATTR = "vlora_head_tasks"


def mark_head_requests_after_init(result, cls, batch, *args, **kwargs):
    """AFTER ``ForwardBatch.init_new``: note, per request of an extend batch, the head
    task asked for (SGLang fills ``sampling_info.custom_params`` only when custom logit
    processors are on, so the forward would not see it otherwise). The note goes on the
    batch's ``sampling_info``, which the runner's copies of the forward batch share."""
    tasks = None
    if result.forward_mode.is_extend():
        asked = [_scheduler_task(req.sampling_params.custom_params) for req in batch.reqs]
        if any(t is not None for t in asked):
            tasks = asked
    if result.sampling_info is not None:
        setattr(result.sampling_info, HEAD_TASKS_ATTR, tasks)
    return result


def logits_forward_around(original, self, input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs):
    """AROUND ``LogitsProcessor.forward``: add head answers for head requests of an
    extend batch (``hidden_states`` are the final, normed states of every token)."""
    output = original(self, input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs)
    tasks = getattr(getattr(logits_metadata, "sampling_info", None), HEAD_TASKS_ATTR, None)
    if not tasks or not logits_metadata.forward_mode.is_extend():
        return output
    answers: list[dict | None] = []
    end = -1
    for i, task in enumerate(tasks):
        end += int(logits_metadata.extend_seq_lens_cpu[i])
        if task is None:
            answers.append(None)
            continue
        lora_id = logits_metadata.lora_ids[i]
        try:
            head = choose_head(_heads_by_lora_id.get(lora_id, {}), task, str(lora_id))
            answers.append(head_answer(head, hidden_states[end]))
        except ValueError as exc:  # validated in the launcher; kept as a per-request error
            answers.append({"error": str(exc)})
    output.customized_info = {**(output.customized_info or {}), RESULT_KEY: answers}
    return output


def skip_empty_answers_around(original, self, meta_info, state, customized_info, index, *args, **kwargs):
    """AROUND ``TokenizerManager.update_request_meta_info`` (launcher): SGLang pads
    ``customized_info`` with one null per token for every request of a batch in which one
    request has an entry, so ordinary requests got ``vlora_head: [null, ...]``. A request
    keeps the field only once it has an answer."""
    values = customized_info.get(RESULT_KEY)
    if (
        values is not None
        and RESULT_KEY not in state.customized_info_accumulated
        and all(answer is None for answer in values[index])
    ):
        customized_info = {key: v for key, v in customized_info.items() if key != RESULT_KEY}
    return original(self, meta_info, state, customized_info, index, *args, **kwargs)


# --------------------------------------------------------------- OpenAI layer
def head_label_as_text_around(original, self, ret_item: dict):
    """AROUND ``OpenAIServingChat._decode_response``: a head answer's text is its label."""
    answers = (ret_item.get("meta_info") or {}).get(RESULT_KEY) or []
    answer = answers[0] if answers else None
    if isinstance(answer, dict) and "label" in answer:
        return answer["label"]
    return original(self, ret_item)
