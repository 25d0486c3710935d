"""The offline package check (``python -m sglang_vlora.adapters check``): real PEFT packages of
the tiny model pass, every broken one fails with its reason, and the published JSON schema of
``vlora_head.json`` agrees with the check. No server: these run in about a second."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_vlora.adapters import (
    HEAD_CONFIG,
    AdapterError,
    ModelShapes,
    check_package,
    read_head_config,
    save_heads,
)
from sglang_vlora.heads.task_head import HeadSpec, TaskHead
from tests.reliability.packages import BAD_PACKAGES, build

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "adapters" / "vlora_head.schema.json").read_text())
SERVED = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}


@pytest.fixture(scope="module")
def model_shapes(tiny_assets) -> ModelShapes:
    return ModelShapes.from_model_dir(tiny_assets[0])


def test_the_tiny_packages_pass(tiny_assets, model_shapes):
    for name, path in tiny_assets[1].items():
        report = check_package(path, model_shapes, max_rank=32, served_modules=SERVED)
        assert report.layers == [0, 1] and report.tensors > 0, name


@pytest.mark.parametrize("bad", BAD_PACKAGES, ids=[b.kind for b in BAD_PACKAGES])
def test_a_broken_package_fails_with_its_reason(bad, tiny_assets, model_shapes, tmp_path):
    root = build(bad, tiny_assets[1]["a8"], tmp_path)
    with pytest.raises(AdapterError) as err:
        check_package(root, model_shapes, max_rank=32, served_modules=SERVED)
    assert bad.reason in str(err.value)


def test_the_command_line_names_each_package(tiny_assets, tmp_path):
    bad = build(BAD_PACKAGES[0], tiny_assets[1]["a8"], tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "sglang_vlora.adapters", "check", str(tiny_assets[1]["c32"]), str(bad),
         "--model", str(tiny_assets[0]), "--max-lora-rank", "32"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ok") and "rank 32" in lines[0]
    assert lines[1].startswith("FAIL") and BAD_PACKAGES[0].reason in lines[1]


def _head_config(tmp_path: Path) -> dict:
    save_heads([TaskHead(HeadSpec("count", ("0", "1", "2"), "How many?"), 128)], tmp_path)
    return json.loads((tmp_path / HEAD_CONFIG).read_text())


def test_the_schema_accepts_what_the_package_writes(tmp_path):
    jsonschema.validate(_head_config(tmp_path), SCHEMA)


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: c.update(format="other"),
        lambda c: c.update(version=2),
        lambda c: c.update(hidden_size=0),
        lambda c: c.update(heads=[]),
        lambda c: c["heads"][0].pop("labels"),
        lambda c: c["heads"][0].update(labels=["only"]),
        lambda c: c["heads"][0].update(task="../x"),
        lambda c: c["heads"][0].update(task_type="regression"),
    ],
    ids=["format", "version", "hidden", "no-heads", "no-labels", "one-label", "task-name", "task-type"],
)
def test_the_schema_and_the_check_refuse_the_same_head_files(edit, tmp_path):
    config = _head_config(tmp_path)
    edit(config)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, SCHEMA)
    (tmp_path / HEAD_CONFIG).write_text(json.dumps(config))
    with pytest.raises(AdapterError):
        read_head_config(tmp_path)


def test_tensors_outside_the_language_model_or_on_experts_are_not_held_to_its_widths(tiny_assets, model_shapes, tmp_path):
    """A VLM adapter may also train the vision tower, an MoE adapter the experts (widths the
    config's dense sizes do not give): checked for rank and finiteness, never refused for width."""
    root = tmp_path / "extra"
    shutil.copytree(tiny_assets[1]["a8"], root)
    tensors = load_file(str(root / "adapter_model.safetensors"))
    vision = "base_model.model.model.visual.blocks.0.attn.qkv"
    experts = "base_model.model.model.language_model.layers.0.mlp.experts.0.gate_proj"
    for prefix, width in ((vision, 32), (experts, 999)):
        tensors[f"{prefix}.lora_A.weight"] = torch.zeros(8, width)
        tensors[f"{prefix}.lora_B.weight"] = torch.zeros(width, 8)
    save_file(tensors, str(root / "adapter_model.safetensors"))
    report = check_package(root, model_shapes, max_rank=32)
    assert any(vision in warning for warning in report.warnings)
    tensors[f"{experts}.lora_A.weight"] = torch.zeros(4, 999)  # the rank still has to agree
    save_file(tensors, str(root / "adapter_model.safetensors"))
    with pytest.raises(AdapterError, match="has rank 4"):
        check_package(root, model_shapes, max_rank=32)
