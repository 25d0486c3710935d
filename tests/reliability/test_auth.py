"""The plugin's routes carry SGLang's auth levels, like SGLang's own admin endpoints:
``POST /vlora/mode`` is ADMIN_OPTIONAL (with an admin key only it; with only ``--api-key``
that key; with no key open), ``GET /vlora/status`` and ``GET /vlora/timeline`` read with any
configured key. Three
servers: both keys (``guarded``), only ``--api-key`` (``one_key``, which also runs the
orchestrator, SGLang's ``--lora-target-modules all`` and a small image limit), and none (the
shared one)."""

from __future__ import annotations

import httpx

from tests.reliability.conftest import ADMIN, ADMIN_KEY, SMALL_IMAGE_LIMIT, USER
from tests.server.reference import chat_text, make_image, png_base64

NONE: dict = {}
WRONG = {"Authorization": "Bearer wrong"}
UNMERGE = {"mode": "unmerge"}


def mode_call(server, headers: dict) -> httpx.Response:
    return httpx.post(server.url + "/vlora/mode", json=UNMERGE, headers=headers, timeout=60)


def status_status(server, headers: dict) -> int:
    return httpx.get(server.url + "/vlora/status", headers=headers, timeout=60).status_code


def timeline_status(server, headers: dict) -> int:
    return httpx.get(server.url + "/vlora/timeline", headers=headers, timeout=60).status_code


def test_both_keys_mode_takes_only_the_admin_key_status_either(guarded):
    assert [mode_call(guarded, h).status_code for h in (NONE, WRONG, USER, ADMIN)] == [401, 401, 401, 200]
    assert [status_status(guarded, h) for h in (NONE, WRONG, USER, ADMIN)] == [401, 401, 200, 200]
    # past the key check, the manual policy's answer: no iteration is timed without an orchestrator
    assert [timeline_status(guarded, h) for h in (NONE, WRONG, USER, ADMIN)] == [401, 401, 400, 400]
    # SGLang's own levels, unchanged: its admin endpoint refuses the user key, generation the admin key.
    load = httpx.post(guarded.url + "/load_lora_adapter", json={"lora_name": "x", "lora_path": "y"}, headers=USER, timeout=60)
    assert load.status_code == 401
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    assert httpx.post(guarded.url + "/generate", json=body, headers=ADMIN, timeout=60).status_code == 401
    assert httpx.post(guarded.url + "/generate", json=body, headers=USER, timeout=60).status_code == 200


def test_only_the_api_key_guards_every_route(one_key):
    admin_like = {"Authorization": f"Bearer {ADMIN_KEY}"}  # not configured here: just a wrong key
    assert [mode_call(one_key, h).status_code for h in (NONE, WRONG, admin_like)] == [401, 401, 401]
    accepted = mode_call(one_key, USER)  # past the key check: this server's modes follow its policy
    assert accepted.status_code == 400 and "--vlora-policy manual" in accepted.text
    assert [status_status(one_key, h) for h in (NONE, WRONG, USER)] == [401, 401, 200]
    assert [timeline_status(one_key, h) for h in (NONE, WRONG, USER)] == [401, 401, 200]  # it runs the orchestrator


def test_no_keys_leave_the_routes_open(server):
    assert mode_call(server, NONE).status_code == 200
    assert status_status(server, NONE) == 200
    assert status_status(server, WRONG) == 200  # nothing to check a key against, as for SGLang's routes


def test_lora_target_modules_all_serves_what_atmm_serves(one_key, tiny_assets):
    """SGLang's "all" adds embed_tokens and lm_head, which atmm does not serve: the server
    starts with the linear modules, says so, and serves an adapter on all of them."""
    log = one_key.log_path.read_text(errors="replace")
    assert "the atmm backend serves LoRA on ['down_proj', 'gate_up_proj', 'o_proj', 'qkv_proj']" in log
    again = {"lora_name": "c32-again", "lora_path": str(tiny_assets[1]["c32"])}
    loaded = httpx.post(one_key.url + "/load_lora_adapter", json=again, headers=USER, timeout=60)
    assert loaded.status_code == 200, loaded.text
    body = {"text": "hi", "lora_path": "c32-again", "sampling_params": {"max_new_tokens": 2}}
    assert httpx.post(one_key.url + "/generate", json=body, headers=USER, timeout=60).status_code == 200
    assert httpx.post(one_key.url + "/unload_lora_adapter", json={"lora_name": "c32-again"}, headers=USER,
                      timeout=60).status_code == 200


def test_the_image_limit_follows_its_flag(one_key):
    image = "data:image/png;base64," + png_base64(make_image(seed=2, size=56))
    body = {"text": chat_text("Describe.", with_image=True), "image_data": image, "sampling_params": {"max_new_tokens": 1}}
    response = httpx.post(one_key.url + "/generate", json=body, headers=USER, timeout=60)
    assert response.status_code == 400, response.text
    assert f"56 x 56 = 3136 pixels is above the server's limit of {SMALL_IMAGE_LIMIT}" in response.text
