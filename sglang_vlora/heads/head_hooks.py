"""Hooks that answer task-head requests inside SGLang (paper §4.2.2), over the plain logic of
:mod:`sglang_vlora.heads.head_requests`. Declared, with their reasons, in
:mod:`sglang_vlora.sglang_hooks`; each takes the process's
:class:`~sglang_vlora.runtime.VLoRARuntime` first. The request-side check runs in the HTTP
server with the other input checks (:func:`sglang_vlora.guard_hooks.validate_requests_around`).

1. scheduler, adapter load: the adapter's heads are loaded beside its LoRA weights
   (SGLang drops non-LoRA tensors from adapter files) and checked against the model's
   hidden size; a mismatch fails the load with the reason. They live in the runtime, by
   SGLang's ``lora_id``;
2. scheduler, forward: each extend batch's head tasks are noted in the runtime; after the
   logits, each head request's last prompt token's final hidden state goes through the
   head; label and top-k probabilities ride in the logits output's ``customized_info`` and
   reach the response's ``meta_info["vlora_head"]``;
3. HTTP server, OpenAI chat completions: the label is the message text (non-streaming), and
   the structured answer is in ``choices[].meta_info`` when ``return_meta_info`` is set; a
   streamed chat completion or a text completion asking for a head is refused (400), since
   either would carry the language model's token instead of the answer.
"""

from __future__ import annotations

import logging

import torch

from sglang_vlora.adapters import load_heads
from sglang_vlora.heads.head_requests import (
    RESULT_KEY,
    choose_head,
    head_answer,
    openai_head_refusal,
    scheduler_task,
)
from sglang_vlora.runtime import VLoRARuntime

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------ scheduler
def _text_hidden_size(hf_config) -> int:
    text_config = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    return int(text_config.hidden_size)


def load_heads_after_validate(rt: VLoRARuntime, result, self, lora_config, lora_ref) -> None:
    """AFTER ``LoRAManager.validate_new_adapter`` (inside SGLang's load ``try``):
    load and check the adapter's heads, so a bad head fails the load with its reason."""
    heads = load_heads(lora_ref.lora_path, _text_hidden_size(self.base_hf_config))
    device = self.device
    dtype = torch.float32
    rt.heads[lora_ref.lora_id] = {task: head.to(device=device, dtype=dtype) for task, head in heads.items()}
    if heads:
        logger.info("sglang-vlora: adapter %s carries heads %s", lora_ref.lora_name, sorted(heads))
    return result


def drop_heads_after_load(rt: VLoRARuntime, result, self, lora_ref):
    """AFTER ``LoRAManager.load_lora_adapter``: forget heads of a load that failed."""
    if not getattr(result, "success", False):
        rt.heads.pop(lora_ref.lora_id, None)
    return result


def drop_heads_after_unload(rt: VLoRARuntime, result, self, lora_ref):
    """AFTER ``LoRAManager.unload_lora_adapter``."""
    if getattr(result, "success", False):
        rt.heads.pop(lora_ref.lora_id, None)
    return result


def mark_head_requests_after_init(rt: VLoRARuntime, result, cls, batch, *args, **kwargs):
    """AFTER ``ForwardBatch.init_new``: note in the runtime, per request of an extend batch,
    the head task asked for (SGLang fills ``sampling_info.custom_params`` only when custom
    logit processors are on, so the forward would not see it otherwise). The note is keyed
    by the batch's ``sampling_info``, which the runner's copies of the forward batch share."""
    tasks = None
    if result.forward_mode.is_extend():
        asked = [scheduler_task(req.sampling_params.custom_params) for req in batch.reqs]
        if any(t is not None for t in asked):
            tasks = asked
    if result.sampling_info is not None:
        rt.note_head_tasks(result.sampling_info, tasks)
    return result


def logits_forward_around(rt: VLoRARuntime, original, self, input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs):
    """AROUND ``LogitsProcessor.forward``: add head answers for head requests of an
    extend batch (``hidden_states`` are the final, normed states of every token)."""
    output = original(self, input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs)
    tasks = rt.head_tasks(getattr(logits_metadata, "sampling_info", None))
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
            head = choose_head(rt.heads.get(lora_id, {}), task, str(lora_id))
            answers.append(head_answer(head, hidden_states[end]))
        except ValueError as exc:  # validated in the HTTP server; kept as a per-request error
            answers.append({"error": str(exc)})
    output.customized_info = {**(output.customized_info or {}), RESULT_KEY: answers}
    return output


# ------------------------------------------------------------------ HTTP server
def skip_empty_answers_around(rt: VLoRARuntime, original, self, meta_info, state, customized_info, index, *args, **kwargs):
    """AROUND ``TokenizerManager.update_request_meta_info``: SGLang pads
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


def head_label_as_text_around(rt: VLoRARuntime, original, self, ret_item: dict):
    """AROUND ``OpenAIServingChat._decode_response``: a head answer's text is its label."""
    answers = (ret_item.get("meta_info") or {}).get(RESULT_KEY) or []
    answer = answers[0] if answers else None
    if isinstance(answer, dict) and "label" in answer:
        return answer["label"]
    return original(self, ret_item)


def chat_head_check_around(rt: VLoRARuntime, original, self, request):
    """AROUND ``OpenAIServingChat._validate_request``: refuse a streamed head request (its
    deltas would be the language model's token, not the label)."""
    error = original(self, request)
    return error or openai_head_refusal("chat", bool(request.stream), request.custom_params)


def completion_head_check_around(rt: VLoRARuntime, original, self, request):
    """AROUND ``OpenAIServingCompletion._validate_request``: refuse a head request (its text
    would be the language model's token, and a completion has no ``meta_info``)."""
    error = original(self, request)
    return error or openai_head_refusal("completions", bool(request.stream), request.custom_params)
