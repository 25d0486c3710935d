"""``/start_profile`` and ``/stop_profile`` on a running server (SGLang's profiling endpoints, at
the admin level). Before the plugin checked them, ``"activities": ["RPD"]`` (AMD's tracer, not
installed) and ``"GPU"`` on this CPU server stopped the scheduler, and with it the server, and an
``output_dir`` that cannot be created stopped it at ``/stop_profile``; an unknown activity
profiled nothing, and a ``/stop_profile`` with no profile running was a 500 with a traceback.
Each bad request now gets a 400 with its reason and the server keeps serving; a good profile
writes its trace."""

from __future__ import annotations

import httpx
import pytest
import torch

from tests.reliability.conftest import ADMIN, USER, assert_serving


def post(server, path: str, body=None) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=ADMIN, timeout=120)


def generate(server) -> None:
    response = httpx.post(server.url + "/generate", headers=USER, timeout=60,
                          json={"text": "profile me", "sampling_params": {"max_new_tokens": 2}})
    assert response.status_code == 200, response.text


@pytest.fixture
def blocker(tmp_path):
    """A regular file: no folder can be created under it."""
    path = tmp_path / "a-file"
    path.write_text("")
    return path


NEEDS_NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA server can record this activity")


@pytest.mark.parametrize("body, reason", [
    ({"activities": ["RPD"]}, "cannot record ['RPD']"),
    pytest.param({"activities": ["GPU"]}, "cannot record ['GPU']", marks=NEEDS_NO_CUDA),
    pytest.param({"activities": ["CPU", "MEM"]}, "cannot record ['MEM']", marks=NEEDS_NO_CUDA),
    pytest.param({"activities": ["CUDA_PROFILER"]}, "cannot record ['CUDA_PROFILER']", marks=NEEDS_NO_CUDA),
    ({"activities": ["FOO"]}, "unknown names ['FOO']"),
    ({"activities": []}, "names no activity"),
    ({"activities": ["CPU"], "num_steps": -2}, "'num_steps' must be a whole number"),
    ({"activities": ["CPU"], "start_step": -1}, "'start_step' must be a whole number"),
    ({"activities": ["CPU"], "output_dir": "BLOCKER/sub"}, "cannot be created"),
])
def test_a_profile_the_server_cannot_run_is_a_400_and_it_keeps_serving(guarded, blocker, body, reason):
    if "output_dir" in body:
        body = {**body, "output_dir": body["output_dir"].replace("BLOCKER", str(blocker))}
    response = post(guarded, "/start_profile", body)
    assert response.status_code == 400, response.text
    assert "profile not started" in response.json()["message"] and reason in response.json()["message"]
    assert_serving(guarded)
    generate(guarded)
    assert post(guarded, "/stop_profile").status_code == 400  # nothing was started
    assert_serving(guarded)


def test_a_cpu_profile_writes_its_trace_and_a_stop_without_a_profile_is_a_400(guarded, tmp_path):
    stopped = post(guarded, "/stop_profile")
    assert stopped.status_code == 400 and "not in progress" in stopped.json()["message"], stopped.text
    out = tmp_path / "traces" / "new"  # created by the check
    started = post(guarded, "/start_profile", {"activities": ["CPU"], "output_dir": str(out)})
    try:
        assert started.status_code == 200, started.text
        generate(guarded)
    finally:
        stopped = post(guarded, "/stop_profile")
    assert stopped.status_code == 200, stopped.text
    assert list(out.glob("*.trace.json*")), list(out.iterdir())
    # No activities named: SGLang's default, less GPU on a server without CUDA.
    started = post(guarded, "/start_profile", {"output_dir": str(out / "default")})
    try:
        assert started.status_code == 200, started.text
        generate(guarded)
    finally:
        assert post(guarded, "/stop_profile").status_code == 200
    assert list((out / "default").glob("*.trace.json*"))
    log = guarded.log_path.read_text()
    assert "Exception in ASGI application" not in log and "Scheduler hit an exception" not in log
    assert_serving(guarded)
