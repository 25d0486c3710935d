"""Every request field of the three generate endpoints, set to values of the wrong type or shape:
the answer is never a 5xx and the server keeps serving. Found this way (SGLang 0.5.23 alone):
a single prompt's ``lora_path: [null]`` or ``return_hidden_states: []`` killed the scheduler
process, and a list ``rid``, an empty ``sampling_params`` list, ``"n": null``, an unknown
``session_params`` field, a chat body or ``response_format`` that is not an object and a batch's
short ``modalities`` or ``custom_logit_processor`` list were 500s.
The corpus in test_bad_input.py checks each of those reasons; this sweep checks the classes."""

from __future__ import annotations

import httpx

from tests.reliability.conftest import USER, assert_serving

WRONG = [None, -1, 1.5, "x", "", [], [None], ["a8"], {}, {"a": 1}, True]
BASES = {
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 2}},
    "/v1/completions": {"model": "default", "prompt": "hi", "max_tokens": 2},
    "/v1/chat/completions": {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
}
FIELDS = {
    "/generate": ["text", "input_ids", "image_data", "sampling_params", "lora_path", "return_logprob",
                  "logprob_start_len", "top_logprobs_num", "stream", "rid", "return_text_in_logprobs",
                  "token_ids_logprob", "modalities", "session_params", "return_hidden_states", "priority",
                  "extra_key", "cache_salt", "custom_logit_processor"],
    "/v1/completions": ["prompt", "max_tokens", "temperature", "top_p", "n", "stop", "logprobs", "echo",
                        "stream_options", "lora_path", "logit_bias", "seed", "response_format", "regex",
                        "json_schema", "top_k", "custom_params", "stop_token_ids", "rid"],
    "/v1/chat/completions": ["messages", "max_tokens", "temperature", "n", "stop", "logprobs", "top_logprobs",
                             "stream_options", "tools", "tool_choice", "response_format", "lora_path",
                             "logit_bias", "reasoning_effort", "reasoning", "chat_template_kwargs",
                             "custom_params", "regex", "json_schema", "rid"],
}
SAMPLING = ["max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "n",
            "json_schema", "regex", "custom_params", "logit_bias", "ignore_eos", "frequency_penalty",
            "repetition_penalty", "min_new_tokens", "sampling_seed"]


# A batch of two prompts: lists of the wrong length, or of entries of the wrong type.
BATCH_FIELDS = ["input_ids", "image_data", "sampling_params", "lora_path", "return_logprob", "logprob_start_len",
                "top_logprobs_num", "rid", "token_ids_logprob", "modalities", "return_hidden_states",
                "custom_logit_processor"]
WRONG_LISTS = [[None, None], [5, 5], ["x", 1], [[], []], [{}, {}], ["a8"], ["a8", "b16", "a8"], [{"a": 1}, {"a": 1}]]


def bodies():
    for path, fields in FIELDS.items():
        for name in fields:
            for value in WRONG:
                yield path, name, {**BASES[path], name: value}
    for name in SAMPLING:
        for value in WRONG:
            yield "/generate", f"sampling_params.{name}", {"text": "hi", "sampling_params": {"max_new_tokens": 2, name: value}}
    for name in BATCH_FIELDS:
        for value in WRONG_LISTS:
            yield "/generate", name, {"text": ["hi", "ho"], "sampling_params": {"max_new_tokens": 2}, name: value}


def test_no_field_of_the_wrong_type_is_a_5xx_or_stops_the_server(guarded):
    failures = []
    with httpx.Client(headers=USER, timeout=60) as client:
        for path, name, body in bodies():
            try:
                status = client.post(guarded.url + path, json=body).status_code
            except httpx.TransportError as exc:  # the server went away while answering
                status = repr(exc)
            if not isinstance(status, int) or status >= 500:
                failures.append((path, name, body[name] if name in body else body["sampling_params"], status))
                assert guarded.alive(), (failures, guarded.log_tail())
    assert not failures, failures
    assert_serving(guarded)
