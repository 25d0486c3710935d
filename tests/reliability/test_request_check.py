"""The request checks on their own (no server): the batched forms SGLang normalizes requests
into, which the server corpus reaches only through single examples."""

from __future__ import annotations

import re

import pytest

from sglang_vlora.request_check import (
    RequestError,
    check_adapter_list,
    check_adapter_name,
    check_custom_params,
    check_image_size,
    check_image_tokens,
    check_prompts,
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
    check_adapter_list(["a8", None], False, 2)
    check_adapter_list("a8", False, 2)
    with pytest.raises(RequestError, match="3 entries for 2 prompts"):
        check_adapter_list(["a", "b", "c"], False, 2)


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
