"""One CPU server for the reliability tests, configured as a deployment would be: both SGLang
keys (user and admin), modes set by hand, four LoRA pool slots, the three tiny adapters.
Its log is printed when a test that uses it fails."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import Server, launch, stop
from tests.server.reference import chat_text

USER_KEY = "user-key"
ADMIN_KEY = "admin-key"
USER = {"Authorization": f"Bearer {USER_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
TEXT = chat_text("What is in the image?", with_image=False)


@pytest.fixture(scope="session")
def guarded(tiny_assets, tmp_path_factory) -> Server:
    model, adapters = tiny_assets
    srv = launch(
        model,
        adapters,
        tmp_path_factory.mktemp("guarded") / "server.log",
        ["--vlora-policy", "manual", "--api-key", USER_KEY, "--admin-api-key", ADMIN_KEY],
    )
    yield srv
    stop(srv)


# The second server: only --api-key, the orchestrator (Algorithm 1) on four pool slots with a
# fifth adapter (b16's files under another name), SGLang's "all" target modules, a small image
# limit. The auth, orchestrator and limit tests share it.
SMALL_IMAGE_LIMIT = 56 * 56 - 1  # one pixel below the test images


@pytest.fixture(scope="session")
def one_key(tiny_assets, tmp_path_factory) -> Server:
    model, adapters = tiny_assets
    srv = launch(
        model,
        {**adapters, "fifth": adapters["b16"]},
        tmp_path_factory.mktemp("one_key") / "server.log",
        ["--api-key", USER_KEY, "--vlora-theta", "60", "--vlora-max-batch", "16", "--lora-target-modules", "all",
         "--vlora-max-image-pixels", str(SMALL_IMAGE_LIMIT)],
    )
    yield srv
    stop(srv)


def assert_serving(server: Server) -> None:
    """The server is up and a good request answers."""
    assert server.alive(), server.log_tail()
    response = httpx.post(
        server.url + "/generate",
        json={"text": TEXT, "lora_path": "a8", "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
        headers=USER,
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.json()["meta_info"]["completion_tokens"] == 1


def set_mode(server: Server, mode: str, adapter: str | None = None, wait_s: float = 0.0) -> httpx.Response:
    body = {"mode": mode, "adapter": adapter, "wait_s": wait_s}
    return httpx.post(server.url + "/vlora/mode", json=body, headers=ADMIN, timeout=120)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for name in ("guarded", "one_key"):
            srv = item.funcargs.get(name)
            if isinstance(srv, Server):
                report.sections.append((f"{name} server log (tail)", srv.log_tail()))
