"""The /start_profile check (sglang_vlora.profile_check): which activities a server can record,
the steps, the trace folder, and what a request naming no activity records."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_vlora import profile_check as pc

CPU_ONLY = {"CPU"}
CUDA = {"CPU", "GPU", "MEM", "CUDA_PROFILER"}


@pytest.mark.parametrize("activities, runnable, expected", [
    (None, CUDA, ["CPU", "GPU"]),
    (None, CPU_ONLY, ["CPU"]),
    (["CPU"], CPU_ONLY, ["CPU"]),
    (["GPU", "MEM", "CUDA_PROFILER"], CUDA, ["GPU", "MEM", "CUDA_PROFILER"]),
])
def test_the_activities_recorded(activities, runnable, expected):
    assert pc.activities_to_record(activities, runnable) == expected


@pytest.mark.parametrize("activities, runnable, reason", [
    (["RPD"], CUDA, "cannot record ['RPD']"),
    (["CPU", "GPU"], CPU_ONLY, "cannot record ['GPU']"),
    (["XPU"], CUDA, "cannot record ['XPU']"),
    (["cpu"], CUDA, "unknown names ['cpu']"),
    (["CPU", "TPU"], CUDA, "unknown names ['TPU']"),
    ([], CUDA, "names no activity"),
    ("CPU", CUDA, "must be a list"),
    ([1], CUDA, "must be a list"),
    ({"CPU": True}, CUDA, "must be a list"),
])
def test_activities_a_server_cannot_record_are_refused(activities, runnable, reason):
    with pytest.raises(pc.ProfileRequestError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        pc.activities_to_record(activities, runnable)


def test_this_process_records_cpu_and_gpu_only_with_cuda():
    import torch

    runnable = pc.runnable_activities()
    assert "CPU" in runnable and runnable <= set(pc.ACTIVITIES)
    assert ("GPU" in runnable) == torch.cuda.is_available()


@pytest.mark.parametrize("num_steps, start_step", [(None, None), (0, 0), (5, 10)])
def test_steps_accepted(num_steps, start_step):
    pc.check_steps(num_steps, start_step)


@pytest.mark.parametrize("num_steps, start_step", [(-1, None), (None, -3), (2.5, None), (True, None), ("3", None)])
def test_steps_refused(num_steps, start_step):
    with pytest.raises(pc.ProfileRequestError, match="must be a whole number"):
        pc.check_steps(num_steps, start_step)


def test_the_trace_folder_is_created_or_refused(tmp_path, monkeypatch):
    pc.check_output_dir(str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(pc.ProfileRequestError, match="cannot be created"):
        pc.check_output_dir(str(blocker / "sub"))
    with pytest.raises(pc.ProfileRequestError, match="must be a folder path"):
        pc.check_output_dir(3)
    monkeypatch.setenv(pc.PROFILER_DIR_ENV, str(tmp_path / "from-env"))
    pc.check_output_dir(None)  # SGLang's default folder, from its variable
    assert (tmp_path / "from-env").is_dir()


def test_a_checked_request_gets_the_activities_it_records(tmp_path):
    req = SimpleNamespace(activities=None, num_steps=None, start_step=None, output_dir=str(tmp_path))
    pc.check_profile_request(req, CPU_ONLY)
    assert req.activities == ["CPU"]
    bad = SimpleNamespace(activities=["GPU"], num_steps=None, start_step=None, output_dir=str(tmp_path))
    with pytest.raises(pc.ProfileRequestError):
        pc.check_profile_request(bad, CPU_ONLY)
    assert bad.activities == ["GPU"]  # a refused request is left as it came


@pytest.mark.parametrize("message, status", [
    ("Profiling is not in progress. Call /start_profile first.", 400),
    ("Profiling is already in progress. Call /stop_profile first.", 409),
    ("Can't disable Kineto profiler when it's not running", 500),
    ("", 500),
])
def test_the_status_of_the_schedulers_failed_answer(message, status):
    assert pc.failed_answer_status(message) == status


@pytest.mark.parametrize("message, status, detail", [
    ("Profiling is not in progress. Call /start_profile first.", 400, "Profiling is not in progress"),
    ("Profiler start failed", 500, "the profiler failed: Profiler start failed"),
])
def test_the_hook_answers_a_failed_profile_with_its_status_and_message(message, status, detail):
    import asyncio

    from fastapi import HTTPException

    from sglang_vlora import guard_hooks

    async def scheduler_answer(manager, req):
        raise RuntimeError(message)

    with pytest.raises(HTTPException) as refused:
        asyncio.run(guard_hooks.profile_result_around(None, scheduler_answer, object(), object()))
    assert refused.value.status_code == status and refused.value.detail.startswith(detail)


def test_the_hook_passes_a_successful_answer_through():
    import asyncio

    from sglang_vlora import guard_hooks

    async def scheduler_answer(manager, req):
        return "Succeeded"

    assert asyncio.run(guard_hooks.profile_result_around(None, scheduler_answer, object(), object())) == "Succeeded"
