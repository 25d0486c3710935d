"""Inference modes inside the running server: with any adapter merged (merge / mixture),
every request (the merged adapter's, other adapters', base-only) passes the parity
suite's check against HF + peft; unmerge brings the base back; operator controls
refuse bad values with a 400. The server is shared: every test ends unmerged."""

import httpx
import pytest

from tests.server.reference import (
    HFReference,
    assert_matches_reference,
    chat_text,
    make_image,
    png_base64,
    sglang_generate,
    sglang_generate_batch,
)

ADAPTERS = [None, "a8", "b16", "c32"]
TEXT = chat_text("What is in the image?", with_image=False)


@pytest.fixture(scope="module")
def reference(server) -> HFReference:
    return HFReference(server.model_dir, server.adapters)


def set_mode(server, mode, adapter=None):
    return httpx.post(server.url + "/vlora/mode", json={"mode": mode, "adapter": adapter}, timeout=120)


@pytest.fixture
def unmerged_after(server):
    yield
    assert set_mode(server, "unmerge").status_code == 200


@pytest.mark.parametrize("mode, merged", [("merge", "c32"), ("mixture", "a8"), ("merge", "b16")])
def test_every_request_matches_hf_with_an_adapter_merged(server, reference, unmerged_after, mode, merged):
    response = set_mode(server, mode, merged)
    assert response.status_code == 200, response.text
    status = response.json()
    assert (status["mode"], status["merged_adapter"]) == (mode, merged)
    image = make_image(seed=21)
    image_text = chat_text("Describe the picture.", with_image=True)
    for adapter in ADAPTERS:
        assert_matches_reference(reference, sglang_generate(server.url, TEXT, adapter), TEXT, None, adapter)
    for adapter in (None, merged):
        gen = sglang_generate(server.url, image_text, adapter, image=image)
        assert_matches_reference(reference, gen, image_text, image, adapter)


def test_the_pool_lives_in_the_base_weights_stacks(server):
    """This server appends the pool's A rows to the base weights (--vlora-shrink-in-gemm on):
    /vlora/status names the module kinds laid out so, and the modes above run over it."""
    status = httpx.get(server.url + "/vlora/status", timeout=60).json()
    assert status["shrink_in_gemm"] == ["down_proj", "gate_up_proj", "o_proj", "qkv_proj"], status


def test_a_mixed_batch_in_mixture_mode(server, unmerged_after):
    alone = {a: sglang_generate(server.url, TEXT, a) for a in ADAPTERS}
    assert set_mode(server, "mixture", "b16").status_code == 200
    batch = sglang_generate_batch(server.url, TEXT, ADAPTERS)
    for adapter, gen in zip(ADAPTERS, batch, strict=True):
        assert gen.tokens == alone[adapter].tokens, adapter


def test_merged_adapters_requests_run_without_lora_work(server, reference, unmerged_after):
    """With c32 merged its requests have no LoRA work: every batch of one runs the base layers
    alone (counted in /vlora/status), and still matches HF + peft; another adapter's request
    (mixture) has work in every batch."""

    def without_work():
        status = httpx.get(server.url + "/vlora/status", timeout=60).json()
        return sum(status["batches_without_lora_work"].values())

    assert set_mode(server, "merge", "c32").status_code == 200
    before = without_work()
    gen = sglang_generate(server.url, TEXT, "c32")
    assert_matches_reference(reference, gen, TEXT, None, "c32")
    assert without_work() - before >= len(gen.tokens)  # the prefill and every decode step
    before = without_work()
    batches = httpx.get(server.url + "/vlora/status", timeout=60).json()["lora_batches"]
    gen = sglang_generate(server.url, TEXT, "a8")
    assert without_work() == before
    # on a CPU no graph is captured: every batch is prepared eagerly, and counted
    after = httpx.get(server.url + "/vlora/status", timeout=60).json()["lora_batches"]
    assert after["eager"] - batches["eager"] >= len(gen.tokens)
    # this server appends the pool's rows, so its eager batches compute the shrink in the base GEMM
    assert after["eager_in_gemm"] - batches["eager_in_gemm"] >= len(gen.tokens)
    assert (after["decode_graph"], after["prefill_graph"]) == (batches["decode_graph"], batches["prefill_graph"])


def test_switches_and_unmerge_restore_the_base(server, reference, unmerged_after):
    before = httpx.get(server.url + "/vlora/status", timeout=60).json()["switch_count"]
    for mode, adapter in [("merge", "a8"), ("merge", "c32"), ("mixture", "b16"), ("unmerge", None)]:
        assert set_mode(server, mode, adapter).status_code == 200
    status = httpx.get(server.url + "/vlora/status", timeout=60).json()
    assert status["mode"] == "unmerge" and status["merged_adapter"] is None
    assert status["switch_count"] == before + 4
    assert status["last_switch_ms"] is not None and status["pristine_bytes"] > 0
    for adapter in ADAPTERS:
        assert_matches_reference(reference, sglang_generate(server.url, TEXT, adapter), TEXT, None, adapter)


@pytest.mark.parametrize(
    "body, reason",
    [
        ({"mode": "fold", "adapter": "a8"}, "mode must be one of"),
        ({"mode": "merge", "adapter": "nope"}, "unknown adapter"),
        ({"mode": "merge"}, "needs the adapter"),
        ({"mode": "unmerge", "adapter": "a8"}, "takes no adapter"),
        ({"mode": 3}, "mode must be a string"),
        ([1, 2], "must be"),
        ({"mode": "unmerge", "adapters": "a8"}, "unknown field(s) ['adapters']"),
        ({"mode": "unmerge", "wait_s": "long"}, "wait_s must be a number of seconds"),
    ],
)
def test_bad_mode_requests_are_400(server, body, reason):
    response = httpx.post(server.url + "/vlora/mode", json=body, timeout=60)
    assert response.status_code == 400
    assert reason in response.text
    assert httpx.get(server.url + "/vlora/status", timeout=60).json()["mode"] == "unmerge"


def test_the_timeline_needs_an_orchestrator(server):
    """Under --vlora-policy manual no iteration is timed: GET /vlora/timeline says so (400)."""
    response = httpx.get(server.url + "/vlora/timeline", timeout=60)
    assert response.status_code == 400 and "--vlora-policy manual" in response.json()["error"], response.text
    assert httpx.get(server.url + "/vlora/status", timeout=60).status_code == 200


def test_bad_json_is_400(server):
    response = httpx.post(server.url + "/vlora/mode", content=b"{oops", timeout=60)
    assert response.status_code == 400


def test_the_merged_adapter_cannot_be_unloaded(server, unmerged_after):
    assert set_mode(server, "merge", "a8").status_code == 200
    response = httpx.post(server.url + "/unload_lora_adapter", json={"lora_name": "a8"}, timeout=60)
    assert response.status_code == 400
    assert "merged" in response.text
    assert sglang_generate(server.url, TEXT, "a8", max_new_tokens=2).tokens


def test_image_kv_is_reused_across_modes_by_the_same_adapter(server, unmerged_after):
    """KV computed unmerged serves the same adapter merged, and the other way round:
    radix entries stay per adapter and every mode computes the same values."""
    image = make_image(seed=33)
    text = chat_text("Describe the picture.", with_image=True)
    unmerged = sglang_generate(server.url, text, "c32", image=image)
    assert set_mode(server, "merge", "c32").status_code == 200
    body = httpx.post(
        server.url + "/generate",
        json={
            "text": text,
            "lora_path": "c32",
            "image_data": "data:image/png;base64," + png_base64(image),
            "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
            "return_logprob": True,
        },
        timeout=120,
    ).json()
    assert body["meta_info"]["cached_tokens"] >= unmerged.prompt_tokens - 1
    assert [t[1] for t in body["meta_info"]["output_token_logprobs"]] == unmerged.tokens
    # Another adapter does not get c32's entries in any mode.
    other = httpx.post(
        server.url + "/generate",
        json={
            "text": text,
            "lora_path": "a8",
            "image_data": "data:image/png;base64," + png_base64(image),
            "sampling_params": {"max_new_tokens": 1},
        },
        timeout=120,
    ).json()
    assert other["meta_info"]["cached_tokens"] < unmerged.prompt_tokens - 1


def test_batches_leave_a_slot_for_the_merged_adapter(server, tmp_path, unmerged_after):
    """With 4 pool slots and a8 merged (holding one), a request set naming four other
    adapters (base included) is split over batches, not crashed, and each answer is right."""
    import shutil

    copy = tmp_path / "c32_copy"
    shutil.copytree(server.adapters["c32"], copy)
    loaded = httpx.post(
        server.url + "/load_lora_adapter", json={"lora_name": "c32_copy", "lora_path": str(copy)}, timeout=120
    )
    assert loaded.status_code == 200, loaded.text
    others = [None, "b16", "c32", "c32_copy"]
    alone = {a: sglang_generate(server.url, TEXT, a) for a in others}
    assert set_mode(server, "merge", "a8").status_code == 200
    batch = sglang_generate_batch(server.url, TEXT, others)
    for adapter, gen in zip(others, batch, strict=True):
        assert gen.tokens == alone[adapter].tokens, adapter
    assert server.alive()
