"""SGLang's frontend language against the plugin's server: multi-round VQA on one
image, the adapter picked per call, and the image's KV reused across rounds."""

import shutil

import httpx
import pytest
import sglang as sgl

from sglang_vlora.adapters import save_heads
from sglang_vlora.frontend import VLoRAEndpoint
from tests.server.reference import chat_text, make_image, parse_generation, png_base64, sglang_generate
from tests.server.test_heads import LABELS, make_head


@sgl.function
def multi_round_vqa(s, image_path, questions):
    s += sgl.user(sgl.image(image_path) + questions[0])
    s += sgl.assistant(sgl.gen("answer_0", max_tokens=4, temperature=0))
    for i, question in enumerate(questions[1:], start=1):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen(f"answer_{i}", max_tokens=4, temperature=0))


QUESTIONS = ["What is in the image?", "How many objects are there?", "Which color dominates?"]


@pytest.fixture(scope="module")
def image_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("frontend") / "frame.png"
    make_image(seed=7).save(path)
    return str(path)


def run(endpoint, image_path):
    return multi_round_vqa.run(image_path=image_path, questions=QUESTIONS, backend=endpoint)


def test_multi_round_vqa_reuses_the_image_kv(server, image_path):
    state = run(sgl.RuntimeEndpoint(server.url), image_path)
    first = state.get_meta_info("answer_0")
    last = state.get_meta_info("answer_2")
    # Rounds after the first reuse the KV of the conversation so far, image included.
    assert last["cached_tokens"] >= first["prompt_tokens"]


def test_adapter_per_call(server, image_path):
    endpoint = VLoRAEndpoint(server.url)
    base = run(endpoint, image_path)
    for adapter in ("a8", "c32"):
        state = run(endpoint.using(adapter), image_path)
        answers = [state[f"answer_{i}"] for i in range(3)]
        assert answers != [base[f"answer_{i}"] for i in range(3)], adapter
        # The last round answers what /generate answers for the same text and adapter.
        text = state.text()
        prefix = text[: text.rfind(state["answer_2"])]
        body = httpx.post(
            server.url + "/generate",
            json={
                "text": prefix,
                "image_data": "data:image/png;base64," + png_base64(make_image(seed=7)),
                "lora_path": adapter,
                "sampling_params": {"max_new_tokens": 4, "temperature": 0},
            },
            timeout=120,
        ).json()
        assert body["text"] == state["answer_2"], adapter


def test_kv_is_not_shared_across_adapters(server, tmp_path):
    text = chat_text("What is in the image?", with_image=True)
    image = make_image(seed=99)
    b16_first = sglang_generate(server.url, text, "b16", image=image, max_new_tokens=1)
    b16_again = httpx.post(
        server.url + "/generate",
        json=request(text, "b16", image),
        timeout=120,
    ).json()["meta_info"]
    a8_first = httpx.post(server.url + "/generate", json=request(text, "a8", image), timeout=120).json()["meta_info"]
    # b16's second request reuses its first one's prompt, image included ...
    assert b16_again["cached_tokens"] >= b16_first.prompt_tokens - 1
    # ... while a8, seeing this image for the first time, cannot reuse b16's entries.
    assert a8_first["cached_tokens"] < b16_again["cached_tokens"]


def request(text, adapter, image):
    return {
        "text": text,
        "lora_path": adapter,
        "image_data": "data:image/png;base64," + png_base64(image),
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
    }


def test_unknown_adapter_fails_clearly(server, image_path):
    state = run(VLoRAEndpoint(server.url).using("no_such_adapter"), image_path)
    assert "no_such_adapter" in str(state.error())


def test_bad_adapter_name_is_refused_locally(server):
    with pytest.raises(ValueError):
        VLoRAEndpoint(server.url).using("")


@sgl.function
def classify(s, image_path):
    s += sgl.user(sgl.image(image_path) + "What is in the image?")
    s += sgl.assistant(sgl.gen("label", max_tokens=8, temperature=0))


def test_head_per_call(server, image_path, tmp_path):
    path = tmp_path / "b16_head"
    shutil.copytree(server.adapters["b16"], path)
    save_heads([make_head("object-class", seed=3)], path)
    loaded = httpx.post(
        server.url + "/load_lora_adapter", json={"lora_name": "b16_head", "lora_path": str(path)}, timeout=120
    )
    assert loaded.status_code == 200, loaded.text
    endpoint = VLoRAEndpoint(server.url)
    state = classify.run(image_path=image_path, backend=endpoint.using("b16_head", head=True))
    assert state["label"] in LABELS
    assert state.get_meta_info("label")["vlora_head"][0]["label"] == state["label"]
    plain = classify.run(image_path=image_path, backend=endpoint.using("b16_head"))
    assert plain.get_meta_info("label")["completion_tokens"] > 1
    with pytest.raises(ValueError, match="belongs to an adapter"):
        endpoint.using(None, head=True)


def test_reloaded_adapter_does_not_reuse_stale_kv(server, tmp_path):
    """An adapter unloaded and loaded again under the same name with other weights
    must not be served from the KV its old weights computed (vLLM issue #30931)."""
    text = chat_text("What is in the image?", with_image=True)
    image = make_image(seed=11)
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(server.adapters["a8"], old)
    shutil.copytree(server.adapters["c32"], new)

    def load(name, path):
        r = httpx.post(server.url + "/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)}, timeout=120)
        assert r.status_code == 200, r.text

    load("swap", old)
    sglang_generate(server.url, text, "swap", image=image)
    assert httpx.post(server.url + "/unload_lora_adapter", json={"lora_name": "swap"}, timeout=60).status_code == 200
    load("swap", new)
    reloaded_body = httpx.post(server.url + "/generate", json={**request(text, "swap", image), "return_logprob": True,
                               "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}},
                               timeout=120).json()
    expected = sglang_generate(server.url, text, "c32", image=image)
    reloaded = parse_generation(reloaded_body)
    assert reloaded.tokens == expected.tokens
    assert reloaded_body["meta_info"]["cached_tokens"] < reloaded.prompt_tokens - 4  # the image was recomputed
