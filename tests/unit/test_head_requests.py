"""Which OpenAI-API head requests can carry the answer (no server)."""

from __future__ import annotations

import pytest

from sglang_vlora.heads.head_requests import openai_head_refusal, requested_task


def test_requested_task():
    assert requested_task(None) is None
    assert requested_task({}) is None
    assert requested_task({"vlora_head": False}) is None
    assert requested_task({"vlora_head": True}) == ""
    assert requested_task({"vlora_head": "object-class"}) == "object-class"
    with pytest.raises(ValueError, match="must be true or a task name"):
        requested_task({"vlora_head": 3})


@pytest.mark.parametrize("head", [True, "object-class"])
def test_only_an_unstreamed_chat_completion_carries_a_head_answer(head):
    params = {"vlora_head": head}
    assert openai_head_refusal("chat", False, params) is None
    assert "streamed chat completion cannot carry" in openai_head_refusal("chat", True, params)
    for stream in (False, True):
        assert "text completion cannot carry" in openai_head_refusal("completions", stream, params)


def test_requests_without_a_head_or_with_a_malformed_one_are_left_alone():
    for params in (None, {}, {"vlora_head": False}, {"other": 1}):
        for endpoint in ("chat", "completions"):
            assert openai_head_refusal(endpoint, True, params) is None
    # malformed: the tokenizer's check answers it with its own reason
    assert openai_head_refusal("completions", False, {"vlora_head": 3}) is None
    assert openai_head_refusal("chat", True, "x") is None
