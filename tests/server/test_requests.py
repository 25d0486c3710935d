"""Requests through /generate and /v1/chat/completions, mixed batches, runtime adapter
loading, and bad input: a clear 4xx or error, and the server keeps serving."""

import json
import shutil

import httpx
import openai
import pytest

from tests.server.reference import (
    LOGPROB_TOL,
    chat_text,
    make_image,
    png_base64,
    sglang_generate,
    sglang_generate_batch,
)

TEXT = chat_text("What is in the image?", with_image=False)


def assert_same_generation(a, b, what: str) -> None:
    assert a.tokens == b.tokens, what
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= LOGPROB_TOL, what


def assert_still_serving(server) -> None:
    assert server.alive()
    gen = sglang_generate(server.url, TEXT, "a8", max_new_tokens=2)
    assert len(gen.tokens) == 2


def test_openai_client_with_adapter_and_image(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    image_url = "data:image/png;base64," + png_base64(make_image(seed=3))
    reply = client.chat.completions.create(
        model=f"{server.model_dir}:b16",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": image_url}},
                    {"type": "text", "text": "Describe the picture."},
                ],
            }
        ],
        max_tokens=4,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 4
    # The same request through /generate with the adapter named there gives the same text.
    text = chat_text("Describe the picture.", with_image=True)
    body = httpx.post(
        server.url + "/generate",
        json={
            "text": text,
            "lora_path": "b16",
            "image_data": image_url,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0},
        },
        timeout=120,
    ).json()
    assert reply.choices[0].message.content == body["text"]


def test_one_batch_of_three_adapters_and_base(server):
    adapters = [None, "a8", "b16", "c32"]
    alone = {a: sglang_generate(server.url, TEXT, a) for a in adapters}
    batch = sglang_generate_batch(server.url, TEXT, adapters)
    for adapter, gen in zip(adapters, batch, strict=True):
        assert_same_generation(gen, alone[adapter], f"adapter={adapter}")


def test_load_and_unload_adapter_at_runtime(server, tmp_path):
    copy = tmp_path / "a8_copy"
    shutil.copytree(server.adapters["a8"], copy)
    loaded = httpx.post(
        server.url + "/load_lora_adapter", json={"lora_name": "a8_copy", "lora_path": str(copy)}, timeout=120
    )
    assert loaded.status_code == 200, loaded.text
    assert_same_generation(
        sglang_generate(server.url, TEXT, "a8_copy"), sglang_generate(server.url, TEXT, "a8"), "a8 loaded again"
    )
    unloaded = httpx.post(server.url + "/unload_lora_adapter", json={"lora_name": "a8_copy"}, timeout=60)
    assert unloaded.status_code == 200, unloaded.text
    # SGLang 0.5.23 treats an unloaded adapter like an evicted one and reloads it from
    # its path on the next request; with the files gone that request must fail cleanly.
    shutil.rmtree(copy)
    after = httpx.post(
        server.url + "/generate",
        json={"text": TEXT, "lora_path": "a8_copy", "sampling_params": {"max_new_tokens": 2}},
        timeout=60,
    )
    assert 400 <= after.status_code < 500, after.text
    assert_still_serving(server)


def test_unknown_adapter_is_a_400(server):
    response = httpx.post(
        server.url + "/generate",
        json={"text": TEXT, "lora_path": "no_such_adapter", "sampling_params": {"max_new_tokens": 2}},
        timeout=60,
    )
    assert response.status_code == 400
    assert "no_such_adapter" in response.text
    assert_still_serving(server)


def test_bad_adapter_path_is_a_clear_error(server, tmp_path):
    response = httpx.post(
        server.url + "/load_lora_adapter",
        json={"lora_name": "missing", "lora_path": str(tmp_path / "does_not_exist")},
        timeout=60,
    )
    assert response.status_code == 400
    assert "does_not_exist': no such folder" in response.text
    assert_still_serving(server)


def test_corrupt_adapter_file_is_a_clear_error(server, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(server.adapters["a8"], broken)
    (broken / "adapter_model.safetensors").write_bytes(b"this is not a safetensors file")
    response = httpx.post(
        server.url + "/load_lora_adapter", json={"lora_name": "broken", "lora_path": str(broken)}, timeout=60
    )
    assert response.status_code == 400
    assert "adapter_model.safetensors: cannot be read" in response.text
    assert_still_serving(server)


def test_rank_above_the_maximum_is_refused(server, tmp_path):
    too_big = tmp_path / "r64"
    shutil.copytree(server.adapters["a8"], too_big)
    config = json.loads((too_big / "adapter_config.json").read_text())
    config["r"] = 64
    (too_big / "adapter_config.json").write_text(json.dumps(config))
    response = httpx.post(
        server.url + "/load_lora_adapter", json={"lora_name": "r64", "lora_path": str(too_big)}, timeout=60
    )
    assert response.status_code == 400
    assert "rank 64 is above the server's --max-lora-rank 32" in response.text
    assert_still_serving(server)


@pytest.mark.parametrize(
    "image_data",
    ["data:image/png;base64,bm90IGFuIGltYWdl", "data:image/png;base64,%%%not-base64%%%"],
    ids=["not-a-png", "not-base64"],
)
def test_malformed_image_is_a_400(server, image_data):
    response = httpx.post(
        server.url + "/generate",
        json={
            "text": chat_text("Describe the picture.", with_image=True),
            "image_data": image_data,
            "sampling_params": {"max_new_tokens": 2},
        },
        timeout=60,
    )
    assert 400 <= response.status_code < 500, response.text
    assert_still_serving(server)


def test_bad_json_is_a_4xx(server):
    response = httpx.post(
        server.url + "/generate", content=b"{not json", headers={"content-type": "application/json"}, timeout=30
    )
    assert 400 <= response.status_code < 500
    assert_still_serving(server)


def test_children_run_the_plugin(server):
    """The scheduler (a spawned process) turned the plugin on from the launcher's
    options: it built the atmm backend, which only the active plugin registers."""
    assert "Using atmm as backend of LoRA kernels" in server.log_path.read_text(errors="replace")
