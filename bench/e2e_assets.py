"""Models and adapters for the end-to-end benchmark (:mod:`bench.run_e2e`), made locally.

* :func:`tiny_model`: the tiny random Qwen2-VL of :mod:`sglang_vlora.tiny_model` (CPU scale).
* :func:`qwen2vl_7b_model`: a directory with a Qwen2-VL-7B-shaped ``config.json``, the tiny
  model's tokenizer and Qwen2-VL-7B's image-size limits, for ``--load-format dummy`` (random
  weights, no checkpoint): the GPU scale. The tokenizer only has to turn prompts into ids; its
  special token ids are written into the config, so image tokens work as in the real model.
* :func:`adapter_pool`: ``n`` LoRA adapters in PEFT's on-disk format (``adapter_config.json``
  + ``adapter_model.safetensors``) for a model directory, written by a small writer here (no
  peft, no network), optionally with a task head each (:mod:`sglang_vlora.adapters`).

Weights are random (``B`` non-zero, so every adapter changes the output). Only ``distinct``
different weight files are drawn; further adapters hard-link one of them: serving time does
not depend on the values, and 64 rank-64 adapters at 7B shapes would otherwise be 5 GB to
write. Each adapter is still loaded, kept and swapped by the server as its own adapter.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
# Labels of the video-understanding head (the head answers the workload's action question).
ACTIONS = ("walking", "running", "jumping", "sitting", "waving", "cooking")
HEAD_TASK = "action"
ASSET_VERSION = 2  # bump when the files written here change

# Qwen2-VL-7B-Instruct's shape (text: Qwen2-7B; vision: 32-layer ViT, 1280 wide).
QWEN2VL_7B_TEXT = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "rms_norm_eps": 1e-6,
}
QWEN2VL_7B_ROPE = {"mrope_section": [16, 24, 24], "rope_theta": 1000000.0, "rope_type": "default"}
QWEN2VL_7B_VISION = {
    "depth": 32,
    "embed_dim": 1280,
    "hidden_size": 3584,
    "mlp_ratio": 4,
    "num_heads": 16,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "in_channels": 3,
    "in_chans": 3,
}
# Qwen2-VL-7B-Instruct's image processor limits: a 448 px image is 256 visual tokens, 672 px 576.
# (The tiny model caps images at 112 x 112 px, 16 tokens, to keep CPU tests fast.)
QWEN2VL_7B_PIXELS = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 16384}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "processor_config.json",
    "generation_config.json",
)


def tiny_model(cache: Path) -> Path:
    """The tiny Qwen2-VL (``python -m sglang_vlora.tiny_model``), built once under ``cache``."""
    from sglang_vlora.tiny_model import build_tiny_model

    return build_tiny_model(Path(cache) / "model")


def qwen2vl_7b_model(out: Path, tokenizer_from: Path) -> Path:
    """Write a Qwen2-VL-7B-shaped model directory (config + tokenizer, no weights) to ``out``.

    ``tokenizer_from`` is a model directory whose tokenizer and processor files are copied
    (the tiny model's); the config takes its special token ids from that directory's config."""
    out, tokenizer_from = Path(out), Path(tokenizer_from)
    marker = out / ".vlora-bench"
    if marker.exists() and marker.read_text() == str(ASSET_VERSION):
        return out
    src = json.loads((tokenizer_from / "config.json").read_text())
    cfg = json.loads(json.dumps(src))  # same structure and token ids, 7B sizes
    text = cfg["text_config"]
    text.update(QWEN2VL_7B_TEXT)
    text["layer_types"] = ["full_attention"] * QWEN2VL_7B_TEXT["num_hidden_layers"]
    text["rope_parameters"] = dict(QWEN2VL_7B_ROPE)
    rope_scaling = {"type": "mrope", "rope_type": "default", "mrope_section": QWEN2VL_7B_ROPE["mrope_section"]}
    text["rope_scaling"] = rope_scaling
    cfg["rope_scaling"] = rope_scaling
    cfg["vision_config"].update(QWEN2VL_7B_VISION)
    cfg["dtype"] = "bfloat16"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).exists():
            shutil.copyfile(tokenizer_from / name, out / name)
    processor = json.loads((out / "preprocessor_config.json").read_text())
    processor.update(QWEN2VL_7B_PIXELS)
    processor["size"] = {"shortest_edge": QWEN2VL_7B_PIXELS["min_pixels"],
                         "longest_edge": QWEN2VL_7B_PIXELS["max_pixels"]}
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
    marker.write_text(str(ASSET_VERSION))
    return out


def text_config(model_dir: Path) -> dict:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return cfg.get("text_config", cfg)


def projection_shapes(model_dir: Path) -> dict[str, tuple[int, int]]:
    """``(in_features, out_features)`` of the attention projections LoRA targets."""
    text = text_config(model_dir)
    hidden, heads = text["hidden_size"], text["num_attention_heads"]
    kv = text.get("num_key_value_heads", heads) * text.get("head_dim", hidden // heads)
    return {"q_proj": (hidden, hidden), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (hidden, hidden)}


def write_lora_adapter(
    out: Path,
    model_dir: Path,
    rank: int,
    alpha: float,
    seed: int,
    dtype: torch.dtype = torch.float32,
    targets: Sequence[str] = TARGETS,
) -> Path:
    """Write one random PEFT LoRA adapter for the language model of ``model_dir``.

    Tensor names follow what peft saves for transformers' Qwen2-VL
    (``base_model.model.model.language_model.layers.{i}.self_attn.{proj}.lora_{A,B}.weight``);
    ``A`` is ``[rank, in]``, ``B`` ``[out, rank]``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = projection_shapes(model_dir)
    layers = text_config(model_dir)["num_hidden_layers"]
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for proj in targets:
            d_in, d_out = shapes[proj]
            key = f"base_model.model.model.language_model.layers.{layer}.self_attn.{proj}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, d_in, generator=gen) / d_in**0.5).to(dtype)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(d_out, rank, generator=gen) / rank**0.5).to(dtype)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    _write_adapter_config(out, model_dir, rank, alpha, targets)
    return out


def _write_adapter_config(out: Path, model_dir: Path, rank: int, alpha: float, targets: Sequence[str]) -> None:
    config = {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": str(model_dir),
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": list(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "use_rslora": False,
        "use_dora": False,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))


def write_head(adapter_dir: Path, hidden_size: int, seed: int) -> None:
    """A random video-understanding task head over :data:`ACTIONS`."""
    from sglang_vlora.adapters import save_heads
    from sglang_vlora.heads.task_head import HeadSpec, TaskHead

    torch.manual_seed(seed)
    spec = HeadSpec(task=HEAD_TASK, labels=ACTIONS, prompt="Which action happens in the video?")
    save_heads([TaskHead(spec, hidden_size)], adapter_dir)


def adapter_names(n: int) -> list[str]:
    width = max(2, len(str(n - 1)))
    return [f"l{i:0{width}d}" for i in range(n)]


def adapter_pool(
    model_dir: Path,
    out: Path,
    n: int,
    ranks: Sequence[int],
    heads: bool = True,
    dtype: torch.dtype = torch.float32,
    distinct: int = 4,
    seed: int = 0,
) -> dict[str, Path]:
    """``n`` adapters named ``l00, l01, ...`` (ranks cycle through ``ranks``) under ``out``.

    Reuses what a previous call with the same arguments wrote."""
    model_dir, out = Path(model_dir), Path(out)
    stamp = json.dumps({"v": ASSET_VERSION, "model": str(model_dir.resolve()), "n": n, "ranks": list(ranks),
                        "heads": heads, "dtype": str(dtype), "distinct": distinct, "seed": seed})
    marker = out / ".vlora-bench"
    names = adapter_names(n)
    paths = {name: out / name for name in names}
    if marker.exists() and marker.read_text() == stamp:
        return paths
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    hidden = text_config(model_dir)["hidden_size"]
    firsts: dict[int, list[Path]] = {}  # rank -> the weight files drawn for it
    for i, name in enumerate(names):
        rank = ranks[i % len(ranks)]
        drawn = firsts.setdefault(rank, [])
        if len(drawn) < max(1, distinct // len(set(ranks))):
            write_lora_adapter(paths[name], model_dir, rank, alpha=2 * rank, seed=seed * 1000 + i + 1, dtype=dtype)
            drawn.append(paths[name] / "adapter_model.safetensors")
        else:
            paths[name].mkdir()
            _link(drawn[i % len(drawn)], paths[name] / "adapter_model.safetensors")
            _write_adapter_config(paths[name], model_dir, rank, 2 * rank, TARGETS)
        if heads:
            write_head(paths[name], hidden, seed=seed * 1000 + i + 1)
    marker.write_text(stamp)
    return paths


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
