"""The plugin's routes carry SGLang's auth levels, like SGLang's own admin endpoints:
``POST /vlora/mode`` is ADMIN_OPTIONAL (with an admin key only it; with only ``--api-key``
that key; with no key open), ``GET /vlora/status`` reads with any configured key. Three
servers: both keys (the reliability server), only ``--api-key``, and none (the shared one).
The ``--api-key`` server also runs with ``--lora-target-modules all`` (SGLang's shorthand) and
a small ``--vlora-max-image-pixels``."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import launch, stop
from tests.reliability.conftest import ADMIN, ADMIN_KEY, USER, USER_KEY
from tests.server.reference import chat_text, make_image, png_base64

NONE: dict = {}
SMALL_IMAGE_LIMIT = 56 * 56 - 1  # one pixel below the test images
WRONG = {"Authorization": "Bearer wrong"}
UNMERGE = {"mode": "unmerge"}


def mode_status(server, headers: dict) -> int:
    return httpx.post(server.url + "/vlora/mode", json=UNMERGE, headers=headers, timeout=60).status_code


def status_status(server, headers: dict) -> int:
    return httpx.get(server.url + "/vlora/status", headers=headers, timeout=60).status_code


@pytest.fixture(scope="module")
def user_key_only(tiny_assets, tmp_path_factory):
    model, adapters = tiny_assets
    srv = launch(
        model, {"a8": adapters["a8"]}, tmp_path_factory.mktemp("user_key_only") / "server.log",
        ["--vlora-policy", "manual", "--api-key", USER_KEY, "--lora-target-modules", "all",
         "--vlora-max-image-pixels", str(SMALL_IMAGE_LIMIT)],
    )
    yield srv
    stop(srv)


def test_both_keys_mode_takes_only_the_admin_key_status_either(guarded):
    assert [mode_status(guarded, h) for h in (NONE, WRONG, USER, ADMIN)] == [401, 401, 401, 200]
    assert [status_status(guarded, h) for h in (NONE, WRONG, USER, ADMIN)] == [401, 401, 200, 200]
    # SGLang's own levels, unchanged: its admin endpoint refuses the user key, generation the admin key.
    load = httpx.post(guarded.url + "/load_lora_adapter", json={"lora_name": "x", "lora_path": "y"}, headers=USER, timeout=60)
    assert load.status_code == 401
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    assert httpx.post(guarded.url + "/generate", json=body, headers=ADMIN, timeout=60).status_code == 401
    assert httpx.post(guarded.url + "/generate", json=body, headers=USER, timeout=60).status_code == 200


def test_only_the_api_key_guards_every_route(user_key_only):
    assert [mode_status(user_key_only, h) for h in (NONE, WRONG, USER)] == [401, 401, 200]
    assert [status_status(user_key_only, h) for h in (NONE, WRONG, USER)] == [401, 401, 200]
    admin_like = {"Authorization": f"Bearer {ADMIN_KEY}"}  # not configured here: just a wrong key
    assert mode_status(user_key_only, admin_like) == 401


def test_no_keys_leave_the_routes_open(server):
    assert mode_status(server, NONE) == 200
    assert status_status(server, NONE) == 200
    assert status_status(server, WRONG) == 200  # nothing to check a key against, as for SGLang's routes


def test_lora_target_modules_all_serves_what_atmm_serves(user_key_only, tiny_assets):
    """SGLang's "all" adds embed_tokens and lm_head, which atmm does not serve: the server
    starts with the linear modules, says so, and serves an adapter on all of them."""
    log = user_key_only.log_path.read_text(errors="replace")
    assert "the atmm backend serves LoRA on ['down_proj', 'gate_up_proj', 'o_proj', 'qkv_proj']" in log
    c32 = {"lora_name": "c32", "lora_path": str(tiny_assets[1]["c32"])}
    loaded = httpx.post(user_key_only.url + "/load_lora_adapter", json=c32, headers=USER, timeout=60)
    assert loaded.status_code == 200, loaded.text
    body = {"text": "hi", "lora_path": "c32", "sampling_params": {"max_new_tokens": 2}}
    assert httpx.post(user_key_only.url + "/generate", json=body, headers=USER, timeout=60).status_code == 200


def test_the_image_limit_follows_its_flag(user_key_only):
    image = "data:image/png;base64," + png_base64(make_image(seed=2, size=56))
    body = {"text": chat_text("Describe.", with_image=True), "image_data": image, "sampling_params": {"max_new_tokens": 1}}
    response = httpx.post(user_key_only.url + "/generate", json=body, headers=USER, timeout=60)
    assert response.status_code == 400, response.text
    assert f"56 x 56 = 3136 pixels is above the server's limit of {SMALL_IMAGE_LIMIT}" in response.text
