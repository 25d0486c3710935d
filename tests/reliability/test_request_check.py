"""The request checks on their own (no server): the batched forms SGLang normalizes requests
into, which the server corpus reaches only through single examples."""

from __future__ import annotations

import re

import pytest

from sglang_vlora.guard_hooks import registered_rids
from sglang_vlora.request_check import (
    BATCH_LISTS,
    SINGLE_VALUES,
    RequestError,
    check_adapter_name,
    check_batch_lists,
    check_custom_params,
    check_image_size,
    check_image_tokens,
    check_prompts,
    check_sampling_params_shape,
    check_session_params,
    check_single_values,
)

TOKEN = re.compile(r"<\|vision_start\|>(?:<\|image_pad\|>)+<\|vision_end\|>|<image>")
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


def test_prompts_single_and_batched():
    check_prompts("hi", None, True, 10)
    check_prompts(["hi", "ho"], None, False, 10)
    check_prompts(None, [[0, 9], [3]], False, 10)
    with pytest.raises(RequestError, match=r"text\[1\] is empty"):
        check_prompts(["hi", ""], None, False, 10)
    with pytest.raises(RequestError, match=r"input_ids\[1\]\[0\] = 10 .* \[0, 10\)"):
        check_prompts(None, [[1], [10]], False, 10)
    with pytest.raises(RequestError, match=r"input_ids\[0\] = True"):
        check_prompts(None, [True], True, 10)
    with pytest.raises(RequestError, match="non-empty list"):
        check_prompts(None, [[1], []], False, 10)


def test_images_per_prompt_in_a_batch():
    two = PLACEHOLDER * 2
    check_image_tokens([two, "no image"], [["a", "b"], None], False, TOKEN, PLACEHOLDER)
    check_image_tokens(PLACEHOLDER, "a", True, TOKEN, PLACEHOLDER)
    check_image_tokens("no image", None, True, TOKEN, PLACEHOLDER)
    with pytest.raises(RequestError, match=r"text\[1\] has 0 image placeholder\(s\) .* image_data\[1\] has 1"):
        check_image_tokens([PLACEHOLDER, "x"], ["a", "b"], False, TOKEN, PLACEHOLDER)
    with pytest.raises(RequestError, match="has 1 image placeholder"):
        check_image_tokens(PLACEHOLDER, ["a", "b"], True, TOKEN, PLACEHOLDER)


def test_custom_params_lists_and_adapters():
    check_custom_params([{"custom_params": {"vlora_head": True}}, {}, None])
    with pytest.raises(RequestError, match=r"sampling_params\[1\].custom_params must be an object"):
        check_custom_params([{}, {"custom_params": "x"}])
    check_batch_lists({"lora_path": ["a8", None], "modalities": None}, 2)
    check_batch_lists({"lora_path": "a8"}, 2)
    for name in BATCH_LISTS:
        with pytest.raises(RequestError, match=rf"^{name} has 3 entries for 2 prompts"):
            check_batch_lists({name: ["a", "b", "c"]}, 2)
        with pytest.raises(RequestError, match=rf"^{name} has 1 entries for 2 prompts"):
            check_batch_lists({name: ["a"]}, 2)


def test_a_single_prompt_takes_one_value_per_field():
    check_single_values({"lora_path": "a8", "rid": "r", "return_hidden_states": "last", "sampling_params": {}})
    check_single_values({"lora_path": None, "rid": None, "return_hidden_states": None, "sampling_params": None})
    for name in SINGLE_VALUES:
        for listed in ([], [None], ["a8", "b16"]):
            with pytest.raises(RequestError, match=rf"^{name} is a list of {len(listed)} for one prompt"):
                check_single_values({name: listed})


def test_sampling_params_shape():
    for good in (None, {}, {"n": 2}, [{"max_new_tokens": 2}, {"n": 1}]):
        check_sampling_params_shape(good)
    for bad, reason in (
        ([], "is an empty list"),
        ("x", "sampling_params must be an object, got str"),
        ([{}, 3], r"sampling_params\[1\] must be an object, got int"),
        ({"n": None}, "sampling_params.n must be a whole number of samples, got None"),
        ({"n": True}, "got True"),
        ([{"n": "2"}], r"sampling_params\[0\].n must be a whole number"),
    ):
        with pytest.raises(RequestError, match=reason):
            check_sampling_params_shape(bad)


@pytest.mark.parametrize("name", ["", ".hidden", "../x", "a/b", "a b", "m:a", "x" * 129, None, 3])
def test_adapter_names_refused(name):
    with pytest.raises(RequestError, match="not a valid adapter name"):
        check_adapter_name(name)


def test_adapter_names_accepted_and_image_size():
    for name in ("a8", "digits-0", "l00", "A.b_c-1", "x" * 128):
        check_adapter_name(name)
    check_image_size(100, 100, 10_000)
    with pytest.raises(RequestError, match="101 x 100 = 10100 pixels"):
        check_image_size(101, 100, 10_000)


def test_session_params_name_known_fields():
    check_session_params({"id": "s"}, ("id", "rid"))
    with pytest.raises(RequestError, match=r"unknown field\(s\) \['a'\]: the fields are \['id', 'rid'\]"):
        check_session_params({"id": "s", "a": 1}, ("id", "rid"))
    with pytest.raises(RequestError, match="session_params must be an object, got list"):
        check_session_params([], ("id",))


def test_a_stream_abort_task_runs_only_for_requests_sglang_can_have_registered():
    assert registered_rids(True, "r1") == ["r1"]
    assert registered_rids(False, ["r1", "r2"]) == ["r1", "r2"]
    assert registered_rids(None, "r1") is None  # normalisation never finished
    assert registered_rids(True, ["x"]) is None  # a single prompt's list rid, refused
    assert registered_rids(False, ["r1", ["x"]]) is None
    assert registered_rids(False, "r1") is None
    assert registered_rids(True, None) is None
