"""The plugin's activation: nothing changes without ``--plugin vlora``; with it, LoRA is
on with backend ``atmm``, CPU defaults fill unset flags, options reach children through
the environment, and a hook that does not apply stops start-up with its name."""

import argparse
import json
import os
import subprocess
import sys

import pytest
from sglang.srt.plugins.hook_registry import HookType

from sglang_vlora import touch_points
from sglang_vlora.config import ENV_VAR, VLoRAConfig, add_cli_args

# Runs in a fresh interpreter (plugins are process-global): load plugins as the
# launcher does, parse a command line, report what SGLang ends up with.
PROBE = r"""
import json, os, sys, torch
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
from sglang.srt.lora.backend.lora_registry import LORA_SUPPORTED_BACKENDS
try:
    args = prepare_server_args(sys.argv[1:])
except SystemExit as exc:
    print(json.dumps({"exit": str(exc)}))
    raise SystemExit(0)
fields = {k: getattr(args, k) for k in ("enable_lora", "lora_backend", "device", "attention_backend",
          "mm_attention_backend", "disable_overlap_schedule", "max_total_tokens", "lora_paths", "sleep_on_idle")}
print(json.dumps({
    "fields": {k: (v if isinstance(v, (str, int, bool, type(None))) else str(v)) for k, v in fields.items()},
    "atmm_registered": "atmm" in LORA_SUPPORTED_BACKENDS,
    "config_env": os.environ.get("SGLANG_VLORA_CONFIG"),
    "cpu_engine_env": os.environ.get("SGLANG_USE_CPU_ENGINE"),
    "pinning_patched": torch.Tensor.pin_memory.__name__ != "pin_memory",
}))
"""

BASE_ARGS = ["--model-path", "some/model", "--lora-paths", "a=some/adapter"]


def probe(argv: list[str], only_sglang_plugins: bool = False, extra_env: dict[str, str] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_VLORA", "SGLANG_USE_CPU", "SGLANG_PLUGINS"))}
    env.update(extra_env or {})
    if only_sglang_plugins:
        env["SGLANG_PLUGINS"] = "none-installed"  # a whitelist that excludes ours
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_installed_but_not_requested_changes_nothing():
    ours = probe(BASE_ARGS)
    stock = probe(BASE_ARGS, only_sglang_plugins=True)
    assert ours["fields"] == stock["fields"]
    assert ours["fields"]["lora_backend"] == "csgmv"
    for result in (ours, stock):
        assert not result["atmm_registered"]
        assert result["config_env"] is None
        assert result["cpu_engine_env"] is None
        assert not result["pinning_patched"]


def test_plugin_turns_on_lora_atmm_and_cpu_defaults():
    result = probe(["--plugin", "vlora", *BASE_ARGS])
    fields = result["fields"]
    assert fields["lora_backend"] == "atmm"
    assert fields["enable_lora"] is True
    assert result["atmm_registered"]
    assert json.loads(result["config_env"]) == {
        "atmm_impl": "auto", "cpu_defaults": True, "cpu_max_total_tokens": 65536,
        "policy": "vlora", "theta": None, "max_batch": None, "admission": "all",
        "keep_merged": "plurality", "popular_share": 0.5, "popular_window": 32,
        "cost_model": None, "max_image_pixels": 32 * 1024 * 1024,
        "shrink_in_gemm": "auto", "eager_in_gemm_max_tokens": 1536, "eager_small_gemm_max_tokens": 64,
        "lora_gemm": "off", "lora_gemm_min_tokens": 1024,
    }
    # This machine has no GPU: the CPU layer and defaults are on.
    assert result["cpu_engine_env"] == "1"
    assert result["pinning_patched"]
    assert fields["device"] == "cpu"
    assert fields["attention_backend"] == "torch_native"
    assert fields["mm_attention_backend"] == "sdpa"
    assert fields["disable_overlap_schedule"] is True
    assert fields["max_total_tokens"] == 65536
    assert fields["sleep_on_idle"] is True


def test_explicit_flags_win_over_plugin_defaults():
    result = probe(
        ["--plugin", "vlora", "--vlora-policy", "manual", "--lora-backend", "triton", "--max-total-tokens", "4096",
         "--vlora-atmm-impl", "torch", "--vlora-max-image-pixels", "1000000", "--vlora-lora-gemm", "on",
         "--vlora-lora-gemm-min-tokens", "4096", "--vlora-eager-in-gemm-max-tokens", "0",
         "--vlora-eager-small-gemm-max-tokens", "16", *BASE_ARGS]
    )
    assert result["fields"]["lora_backend"] == "triton"
    assert result["fields"]["max_total_tokens"] == 4096
    config = json.loads(result["config_env"])
    assert (config["atmm_impl"], config["max_image_pixels"]) == ("torch", 1000000)
    assert (config["lora_gemm"], config["lora_gemm_min_tokens"]) == ("on", 4096)
    assert (config["eager_in_gemm_max_tokens"], config["eager_small_gemm_max_tokens"]) == (0, 16)


def test_atmm_without_plugin_is_refused():
    result = probe(["--lora-backend", "atmm", *BASE_ARGS])
    assert "needs --plugin vlora" in result["exit"]


def test_unknown_plugin_name_is_refused():
    result = probe(["--plugin", "vlroa", *BASE_ARGS])
    assert "unknown plugin" in result["exit"]


def test_bad_option_value_is_refused():
    result = probe(["--plugin", "vlora", "--vlora-cpu-max-total-tokens", "0", *BASE_ARGS])
    assert "must be positive" in result.get("exit", "")


@pytest.mark.parametrize(
    "flags, reason",
    [
        (["--vlora-max-batch", "0"], "--vlora-max-batch must be"),
        (["--vlora-eager-in-gemm-max-tokens", "100000"], "--vlora-eager-in-gemm-max-tokens must be between 0 and 65536"),
        (["--lora-backend", "triton"], "needs --lora-backend atmm"),
        (["--vlora-policy", "dlora", "--pp-size", "2"], "tensor parallelism only"),
    ],
)
def test_bad_orchestrator_flags_are_refused_at_launch(flags, reason):
    result = probe(["--plugin", "vlora", *flags, *BASE_ARGS])
    assert reason in result.get("exit", ""), result


@pytest.mark.parametrize("switch", ["SGLANG_VLORA_DIRECT_LAUNCH", "SGLANG_VLORA_PDL"])
def test_a_bad_launch_switch_is_refused_at_launch(switch):
    result = probe(["--plugin", "vlora", *BASE_ARGS], extra_env={switch: "false"})
    assert f"{switch} must be 0 or 1, got 'false'" in result.get("exit", ""), result


@pytest.mark.parametrize(("flag", "value"), [("--vlora-admission", "fifo"), ("--vlora-keep-merged", "always")])
def test_unknown_choice_is_refused_by_name(capsys, flag, value):
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args([flag, value])
    assert f"{flag}: invalid choice: '{value}'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "options, reason",
    [
        ({"policy": "fifo"}, "--vlora-policy must be one of"),
        ({"theta": -1.0}, "--vlora-theta must be"),
        ({"theta": float("inf")}, "--vlora-theta must be"),
        ({"theta": float("nan")}, "--vlora-theta must be"),
        ({"max_batch": 0}, "--vlora-max-batch must be"),
        ({"admission": "fifo"}, "--vlora-admission must be one of"),
        ({"keep_merged": "always"}, "--vlora-keep-merged must be one of"),
        ({"popular_share": 1.0}, "--vlora-popular-share must be in"),
        ({"popular_share": -0.1}, "--vlora-popular-share must be in"),
        ({"popular_window": 0}, "--vlora-popular-window must be between 1 and 4096"),
        ({"popular_window": 4097}, "--vlora-popular-window must be between 1 and 4096"),
        ({"cost_model": "no/such/costs.json"}, "no such file"),
        ({"max_image_pixels": 0}, "--vlora-max-image-pixels must be"),
        ({"shrink_in_gemm": "yes"}, "--vlora-shrink-in-gemm must be one of"),
        ({"lora_gemm": "auto"}, "--vlora-lora-gemm must be one of"),
        ({"lora_gemm_min_tokens": 0}, "--vlora-lora-gemm-min-tokens must be"),
        ({"eager_in_gemm_max_tokens": -1}, "--vlora-eager-in-gemm-max-tokens must be between 0 and 65536"),
        ({"eager_in_gemm_max_tokens": 65537}, "--vlora-eager-in-gemm-max-tokens must be between 0 and 65536"),
        ({"eager_small_gemm_max_tokens": -1}, "--vlora-eager-small-gemm-max-tokens must be between 0 and 256"),
        ({"eager_small_gemm_max_tokens": 257}, "--vlora-eager-small-gemm-max-tokens must be between 0 and 256"),
    ],
)
def test_bad_orchestrator_options_are_refused(options, reason):
    with pytest.raises(ValueError, match=reason):
        VLoRAConfig(**options)


def test_orchestrator_flags_reach_the_children():
    result = probe(
        ["--plugin", "vlora", "--vlora-policy", "unmerge-only", "--lora-backend", "triton",
         "--vlora-theta", "0.25", "--vlora-max-batch", "12", "--vlora-admission", "algorithm1",
         "--vlora-keep-merged", "majority", *BASE_ARGS]
    )
    config = json.loads(result["config_env"])
    assert (config["policy"], config["theta"], config["max_batch"]) == ("unmerge-only", 0.25, 12)
    assert (config["admission"], config["keep_merged"]) == ("algorithm1", "majority")  # not the defaults


def test_config_round_trips_through_the_environment(monkeypatch):
    cfg = VLoRAConfig(atmm_impl="torch", cpu_defaults=False, cpu_max_total_tokens=1024)
    monkeypatch.delenv(ENV_VAR, raising=False)
    cfg.to_env()
    assert VLoRAConfig.from_env() == cfg
    monkeypatch.setenv(ENV_VAR, json.dumps({"atmm_impl": "torch", "bogus": 1}))
    with pytest.raises(ValueError, match="bogus"):
        VLoRAConfig.from_env()


def test_self_check_names_a_hook_that_did_not_apply():
    def never_registered(*args, **kwargs):
        return None

    missing = touch_points.Hook(
        "sglang.srt.server_args.ServerArgs.url", HookType.AFTER, never_registered, "test", ()
    )
    with pytest.raises(RuntimeError, match="ServerArgs.url did not apply"):
        touch_points.verify_applied([missing])
    typo = touch_points.Hook("sglang.srt.server_args.ServerArgz.url", HookType.AFTER, never_registered, "test", ())
    with pytest.raises(RuntimeError, match="ServerArgz.url not found"):
        touch_points.verify_applied([typo])


def test_self_check_accepts_an_applied_hook():
    from sglang.srt.plugins.hook_registry import HookRegistry

    def after_url(bound, result, *args, **kwargs):
        return result

    hook = touch_points.Hook(
        "sglang.srt.server_args.ServerArgs.get_tokenizer_worker_class", HookType.AFTER, after_url, "test", ()
    )
    touch_points.register([hook], "bound first argument")
    HookRegistry.apply_hooks()
    touch_points.verify_applied([hook])


@pytest.mark.parametrize(
    "api_key, admin_key, allowed",
    [
        ("U", "A", {None: False, "U": True, "A": True, "W": False}),
        ("U", None, {None: False, "U": True, "A": False, "W": False}),
        (None, "A", {None: False, "U": False, "A": True, "W": False}),
        (None, None, {None: True, "U": True, "A": True, "W": True}),
    ],
    ids=["both-keys", "api-key", "admin-key", "no-keys"],
)
def test_status_reads_with_any_configured_key_and_mode_keeps_sglangs_admin_level(api_key, admin_key, allowed):
    """The auth decision SGLang's middleware asks for each request: /vlora/status through the
    plugin's hook, /vlora/mode through SGLang's own ADMIN_OPTIONAL rule."""
    from sglang.srt.utils.auth import AuthLevel, decide_request_auth

    from sglang_vlora.guard_hooks import decide_auth_around
    from sglang_vlora.runtime import VLoRARuntime

    def decide(path: str, key: str | None, level: AuthLevel) -> bool:
        return decide_auth_around(
            VLoRARuntime(VLoRAConfig()), decide_request_auth, method="GET", path=path, authorization_header=f"Bearer {key}" if key else None,
            api_key=api_key, admin_api_key=admin_key, auth_level=level,
        ).allowed

    assert {key: decide("/vlora/status", key, AuthLevel.NORMAL) for key in allowed} == allowed
    admin_only = admin_key or api_key
    expected_mode = {key: admin_only is None or key == admin_only for key in allowed}
    assert {key: decide("/vlora/mode", key, AuthLevel.ADMIN_OPTIONAL) for key in allowed} == expected_mode
