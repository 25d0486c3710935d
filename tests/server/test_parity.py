"""Parity with HF transformers + peft: base model and every adapter, text and image prompts.

This is the suite every later capability runs against: teacher-forced log-probs of
SGLang's greedy tokens within LOGPROB_TOL of HF's, and SGLang's token equal to HF's
top-1 wherever HF's top-1 margin exceeds that tolerance.
"""

import pytest

from tests.server.reference import (
    HFReference,
    assert_matches_reference,
    chat_text,
    make_image,
    sglang_generate,
)

ADAPTERS = [None, "a8", "b16", "c32"]
QUESTIONS = ["What is in the image?", "Count the digits in the picture."]


@pytest.fixture(scope="module")
def reference(server) -> HFReference:
    return HFReference(server.model_dir, server.adapters)


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("question", QUESTIONS)
def test_text_prompt_matches_hf(server, reference, adapter, question):
    text = chat_text(question, with_image=False)
    gen = sglang_generate(server.url, text, adapter)
    assert_matches_reference(reference, gen, text, None, adapter)


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("size", [56, 112])
def test_image_prompt_matches_hf(server, reference, adapter, size):
    image = make_image(seed=size, size=size)
    text = chat_text("Describe the picture.", with_image=True)
    gen = sglang_generate(server.url, text, adapter, image=image)
    assert_matches_reference(reference, gen, text, image, adapter)


def test_adapters_change_the_output(server):
    """Guards the suite itself: with adapters this strong, every adapter's greedy
    tokens differ from the base model's, so parity is not a comparison of no-ops."""
    text = chat_text("What is in the image?", with_image=False)
    outputs = {a: sglang_generate(server.url, text, a).tokens for a in ADAPTERS}
    for adapter in ADAPTERS[1:]:
        assert outputs[adapter] != outputs[None], adapter
