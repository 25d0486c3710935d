"""Every request field of the three generate endpoints, set to values of the wrong type or shape:
the answer is never a 5xx and the server keeps serving. Found this way (SGLang 0.5.23 alone):
a single prompt's ``lora_path: [null]`` or ``return_hidden_states: []`` killed the scheduler
process, and a list ``rid``, an empty ``sampling_params`` list, ``"n": null``, an unknown
``session_params`` field, a chat body or ``response_format`` that is not an object and a batch's
short ``modalities`` or ``custom_logit_processor`` list were 500s.
Streamed, the refusals of requests SGLang had not registered made the stream's abort task raise
and uvicorn close the connection, and refusals before an adapter's use was counted logged a
failed release.
The corpus in test_bad_input.py checks each of those reasons; this sweep checks the classes."""

from __future__ import annotations

import httpx
import pytest

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


# Where null is not wrong: a chat request without max_tokens generates up to the context length.
NULL_IS_VALID = {("/v1/chat/completions", "max_tokens")}


def bodies():
    for path, fields in FIELDS.items():
        for name in fields:
            for value in WRONG:
                if value is None and (path, name) in NULL_IS_VALID:
                    continue
                yield path, name, {**BASES[path], name: value}
    for name in SAMPLING:
        for value in WRONG:
            yield "/generate", f"sampling_params.{name}", {"text": "hi", "sampling_params": {"max_new_tokens": 2, name: value}}
    for name in BATCH_FIELDS:
        for value in WRONG_LISTS:
            yield "/generate", name, {"text": ["hi", "ho"], "sampling_params": {"max_new_tokens": 2}, name: value}


@pytest.mark.parametrize("stream", [False, True], ids=["answered", "streamed"])
def test_no_field_of_the_wrong_type_is_a_5xx_or_stops_the_server(guarded, stream):
    """Streamed, a refusal is an error event in a 200 stream; the stream's background task then
    must not fail (it used to, for requests refused before SGLang registered them, and uvicorn
    closed the keep-alive connection, cutting the next answer on it)."""
    start = guarded.log_path.stat().st_size
    failures = []
    with httpx.Client(headers=USER, timeout=60) as client:
        for path, name, body in bodies():
            if stream and name == "stream":
                continue
            try:
                status = client.post(guarded.url + path, json={**body, "stream": True} if stream else body).status_code
            except httpx.TransportError as exc:  # the server went away, or closed the connection, while answering
                status = repr(exc)
            if not isinstance(status, int) or status >= 500:
                failures.append((path, name, body[name] if name in body else body["sampling_params"], status))
                assert guarded.alive(), (failures, guarded.log_tail())
    assert not failures, failures
    assert_serving(guarded)
    with guarded.log_path.open(errors="replace") as log:
        log.seek(start)
        written = log.read()
    for failed in ("Exception in ASGI application", "Task exception was never retrieved"):
        assert failed not in written, written[written.index(failed):][:3000]
