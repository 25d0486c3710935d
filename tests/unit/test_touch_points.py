"""The touch-point table (sglang_vlora.sglang_hooks) against the installed SGLang, and the check
that stops start-up with the installed and the pinned SGLang version when something moved."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from sglang.srt.plugins.hook_registry import HookType

from sglang_vlora import sglang_hooks, touch_points
from sglang_vlora.touch_points import SGLANG_PINNED, Hook, SGLangMismatch, TouchPoint, check

REPO = Path(__file__).resolve().parents[2]
HERE = __name__  # targets below resolve to this module's stand-ins


class FakeManager:
    """A stand-in for an SGLang class: a field, an attribute set in ``__init__`` and one set
    in another method, a method."""

    pinned: bool = False

    def __init__(self) -> None:
        self.registry = {}

    def load(self, lora_ref, config_dict) -> None:
        self.loaded = (lora_ref, config_dict)


def list_names() -> frozenset:
    return frozenset({"tp_size", "tp_rank"})


def reads_env() -> str | None:
    return os.environ.get("SOME_ENGINE_FLAG")


DEFAULT_BACKEND = "csgmv"


def never_applied(rt, original, *args, **kwargs):
    return original(*args, **kwargs)


def point(**kwargs) -> TouchPoint:
    return TouchPoint(kind=kwargs.pop("kind", "read"), why="test", ours="tests", **kwargs)


def test_check_accepts_what_is_there():
    check(
        [Hook(f"{HERE}.FakeManager.load", HookType.AROUND, never_applied, "test", ("self", "lora_ref"))],
        [
            point(target=f"{HERE}.FakeManager", attrs=("registry", "loaded", "pinned", "load")),
            point(kind="call", target=f"{HERE}.FakeManager.load", params=("self", "lora_ref", "config_dict")),
            point(target=f"{HERE}.list_names", listed=("tp_rank",)),
            point(kind="bridge", target=f"{HERE}.reads_env", source_has=("SOME_ENGINE_FLAG",)),
            point(kind="value", target=f"{HERE}.DEFAULT_BACKEND", expected="csgmv"),
        ],
    )


@pytest.mark.parametrize(
    ("moved", "says"),
    [
        (point(target=f"{HERE}.FakeManager", attrs=("registry", "_registry")), "no attribute _registry"),
        (point(kind="call", target=f"{HERE}.FakeManager.load", params=("self", "lora_ref", "tensors")),
         "parameters are (self, lora_ref, config_dict), expected to start with (self, lora_ref, tensors)"),
        (point(kind="call", target=f"{HERE}.FakeManager.unload", params=("self",)), "not found"),
        (point(kind="call", target=f"{HERE}_gone.FakeManager", params=()), "not found"),
        (point(target=f"{HERE}.list_names", listed=("tp_group",)), "does not list tp_group"),
        (point(kind="bridge", target=f"{HERE}.reads_env", source_has=("OTHER_FLAG",)), "no longer uses OTHER_FLAG"),
        (point(kind="value", target=f"{HERE}.DEFAULT_BACKEND", expected="triton"), "expected 'triton'"),
    ],
    ids=["attribute", "signature", "method", "module", "listed", "source", "value"],
)
def test_check_names_what_moved_and_both_versions(moved, says):
    with pytest.raises(SGLangMismatch) as caught:
        check([], [point(target=f"{HERE}.FakeManager", attrs=("registry",)), moved])
    message = str(caught.value)
    assert f"written for SGLang {SGLANG_PINNED}" in message
    assert f"the installed SGLang is {importlib.metadata.version('sglang')}" in message
    assert f"Install sglang=={SGLANG_PINNED}" in message
    assert says in message and moved.target in message
    assert message.count("\n  - ") == 1  # only what moved


def table_point(target: str) -> TouchPoint:
    return next(p for p in sglang_hooks.SERVER_POINTS if p.target == target)


def test_a_moved_private_attribute_of_sglang_is_caught(monkeypatch):
    """SGLang's registry keeps its adapters in the private ``_registry``: if a release renames
    it, the check says so instead of a request failing with an AttributeError."""
    from sglang.srt.lora.lora_registry import LoRARegistry

    target = table_point("sglang.srt.lora.lora_registry.LoRARegistry")
    check([], [target])

    def renamed_init(self, *args, **kwargs):
        self.adapters_by_name = {}

    monkeypatch.setattr(LoRARegistry, "__init__", renamed_init)
    with pytest.raises(SGLangMismatch, match=r"LoRARegistry: no attribute _registry \(our guard_hooks._lora_path\)"):
        check([], [target])


def test_a_changed_signature_of_a_called_sglang_function_is_caught(monkeypatch):
    from sglang.srt.utils import network

    target = table_point("sglang.srt.utils.network.get_zmq_socket")
    check([], [target])

    def get_zmq_socket(context, socket_type, address=None, bind=True):
        return None

    monkeypatch.setattr(network, "get_zmq_socket", get_zmq_socket)
    with pytest.raises(SGLangMismatch, match=r"expected to start with \(context, socket_type, endpoint, bind\)"):
        check([], [target])


def test_the_pin_is_the_one_pyproject_installs():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"sglang=={SGLANG_PINNED}" in dependencies


def test_every_hook_declares_its_reason_and_every_point_its_kind():
    for entry in sglang_hooks.TOUCH_POINTS:
        assert entry.why and entry.target
    kinds = {p.kind for p in sglang_hooks.SERVER_POINTS}
    assert kinds == set(touch_points.KINDS)  # each kind of touch point is declared somewhere


# Fresh interpreters: the CPU bridges and hooks are process-wide.
CHECK_PROBE = r"""
from sglang_vlora import cpu_compat, sglang_hooks, touch_points
cpu_compat.activate()
touch_points.check(sglang_hooks.ARG_HOOKS + sglang_hooks.ACTIVE_HOOKS,
                   sglang_hooks.SERVER_POINTS + sglang_hooks.CLIENT_POINTS)
print("checked", len(sglang_hooks.TOUCH_POINTS))
"""

MOVED_PROBE = r"""
import json, sys
from sglang_vlora import cpu_compat
cpu_compat.activate()
from sglang.srt.managers.scheduler import Scheduler
def can_schedule_lora_req(self, request, running_loras):  # a renamed parameter
    return True
Scheduler.can_schedule_lora_req = can_schedule_lora_req
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
try:
    prepare_server_args(sys.argv[1:])
except SystemExit as exc:
    print(json.dumps({"exit": str(exc)}))
    raise SystemExit(0)
print(json.dumps({"exit": None}))
"""


def run_probe(code: str, *argv: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_VLORA", "SGLANG_PLUGINS"))}
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_every_touch_point_matches_the_installed_sglang():
    assert run_probe(CHECK_PROBE) == f"checked {len(sglang_hooks.TOUCH_POINTS)}"


def test_start_up_stops_naming_what_moved():
    result = json.loads(run_probe(MOVED_PROBE, "--plugin", "vlora", "--model-path", "some/model"))
    message = result["exit"]
    assert message is not None, "start-up went on with a moved SGLang function"
    assert "Scheduler.can_schedule_lora_req: parameters are (self, request, running_loras)" in message
    assert f"written for SGLang {SGLANG_PINNED}" in message
    assert "our sglang_vlora.orchestrator.scheduler_hooks.can_schedule_around" in message
