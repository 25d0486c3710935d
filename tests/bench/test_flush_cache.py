"""Every e2e measurement starts from an empty prefix cache: the harness's flush against the
real CPU test server, and the runner calling it before each measurement."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import httpx
import pytest

from bench.e2e import plan, runner, servers
from tests.server.reference import make_image, png_base64


def _generate(server, prompt: str, image: str | None = None) -> dict:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    if image is not None:
        body["image_data"] = image
    resp = httpx.post(server.url + "/generate", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()["meta_info"]


def test_flush_empties_the_prefix_cache_of_text_and_images(server):
    image = f"data:image/png;base64,{png_base64(make_image(seed=31))}"
    prompt = "<|vision_start|><|image_pad|><|vision_end|>Describe the scene in one word, please."
    first = _generate(server, prompt, image)
    again = _generate(server, prompt, image)
    assert again["cached_tokens"] >= first["prompt_tokens"] - 1  # the second time, all but the last token hit
    servers.flush_cache(server)
    after = _generate(server, prompt, image)
    assert after["cached_tokens"] == 0


def test_flush_failure_is_an_error(server):
    broken = dataclasses.replace(server, url=server.url + "/no-such-prefix")
    with pytest.raises(RuntimeError, match="flush_cache answered 404"):
        servers.flush_cache(broken, wait_s=1)


def test_every_measurement_flushes_first(monkeypatch, tmp_path):
    calls: list[str] = []
    monkeypatch.setattr(servers, "flush_cache", lambda srv: calls.append("flush"))
    monkeypatch.setattr(servers, "vlora_status", lambda srv: calls.append("status") or {})
    monkeypatch.setattr(servers, "vlora_timeline", lambda srv, since: calls.append("timeline") or None)

    def run_own(srv, reqs, labels=None):
        calls.append("requests")
        return {"metrics": {}}

    monkeypatch.setattr(runner.measure, "run_own", run_own)
    point = plan.CPU_POINTS["vision-skewed"]
    clients = runner.Clients(tmp_path)
    monkeypatch.setattr(clients, "requests", lambda *a: [])
    server = SimpleNamespace(process=SimpleNamespace(pid=os.getpid()))  # its host time: this process's
    result = runner.measure_one(server, plan.SYSTEMS["vlora"], point, ["a"], 0, clients)
    assert calls == ["flush", "status", "requests", "status", "timeline"]
    assert result["host"]["processes"] >= 1
