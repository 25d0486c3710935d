"""A tiny random-weight Qwen2-VL and tiny PEFT adapters, built offline from a seed.

The model has the real Qwen2-VL architecture (vision tower, merger, M-RoPE, chat
template, image processor) at toy size, so SGLang serves it with the same code path
as Qwen2-VL-7B. Everything is built locally: a byte-level BPE tokenizer is trained on
a fixed corpus, weights are drawn from ``torch.Generator(seed)``, and the adapters are
saved by ``peft`` itself.

    python -m sglang_vlora.tiny_model --out .cache/tiny

writes ``.cache/tiny/model`` and ``.cache/tiny/adapters/{a8,b16,c32}``; a second call
with the same arguments reuses what is there.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen2-VL's chat template, reduced to what the tiny model needs: system / user /
# assistant turns, images and videos inside user content, generation prompt.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS = """\
What is in the image? Describe the picture in one sentence. How many people are there?
Is there a car on the road? Yes. No. The image shows a red car parked next to a tree.
A man is riding a bicycle along the river. Two dogs are playing in the park.
Detect the objects in the frame and give their boxes. <ref>the person</ref><box>(120,200),(340,880)</box>
Which action happens in the video? walking, running, jumping, sitting, waving, cooking.
Answer the question about the image. The cat sleeps on the sofa near the window.
Count the digits in the picture. Which quadrant holds the seven? top left, top right,
bottom left, bottom right. zero one two three four five six seven eight nine ten.
The quick brown fox jumps over the lazy dog. A camera watches the street at night.
Traffic light, bus, truck, pedestrian, crossing, building, sky, cloud, grass, water.
Please caption this image for a visually impaired reader. The weather is sunny today.
"""


@dataclass(frozen=True)
class TinySpec:
    """Sizes of the tiny model. Head dim 32 with M-RoPE sections (4, 6, 6)."""

    hidden: int = 128
    intermediate: int = 256
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 1024
    vision_embed: int = 32
    vision_depth: int = 1
    vision_heads: int = 2
    mrope_section: tuple[int, int, int] = (4, 6, 6)


ADAPTERS = {
    # name: (rank, alpha, target modules)
    "a8": (8, 16, ["q_proj", "k_proj", "v_proj", "o_proj"]),
    "b16": (16, 16, ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]),
    "c32": (32, 32, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
}


def _build_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines() * 4, trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    # SGLang and the Qwen2-VL processor look for the Qwen2 tokenizer class.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2))


def _token_id(out: Path, token: str) -> int:
    data = json.loads((out / "tokenizer.json").read_text())
    for added in data["added_tokens"]:
        if added["content"] == token:
            return int(added["id"])
    raise KeyError(token)


def build_tiny_model(out: Path | str, seed: int = 0, spec: TinySpec = TinySpec()) -> Path:
    """Write a tiny random Qwen2-VL (config, safetensors, tokenizer, processor) to ``out``.

    Returns ``out``. Deterministic for a given seed and spec.
    """
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    out = Path(out)
    if (out / "model.safetensors").exists():
        return out
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _build_tokenizer(tmp, spec.vocab)
    ids = {t: _token_id(tmp, t) for t in SPECIAL_TOKENS}
    head_dim = spec.hidden // spec.heads
    if 2 * sum(spec.mrope_section) != head_dim:
        raise ValueError("mrope_section must sum to head_dim / 2")
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(spec.mrope_section)}
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": spec.vocab,
            "hidden_size": spec.hidden,
            "intermediate_size": spec.intermediate,
            "num_hidden_layers": spec.layers,
            "num_attention_heads": spec.heads,
            "num_key_value_heads": spec.kv_heads,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            "rope_parameters": rope,
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "tie_word_embeddings": False,
        },
        vision_config={
            "depth": spec.vision_depth,
            "embed_dim": spec.vision_embed,
            "hidden_size": spec.hidden,
            "num_heads": spec.vision_heads,
            "mlp_ratio": 2,
            "in_channels": 3,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).to(torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight") or ".norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            elif name.endswith("bias"):
                param.copy_(0.02 * torch.randn(param.shape, generator=generator))
            else:
                fan_in = param.shape[-1] if param.dim() > 1 else param.shape[0]
                std = 1.0 / fan_in**0.5 if "embed_tokens" not in name else 1.0
                param.copy_(std * torch.randn(param.shape, generator=generator))
    model.save_pretrained(tmp, safe_serialization=True)
    _write_processor(tmp)
    _patch_config(tmp / "config.json", spec)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _write_processor(out: Path) -> None:
    image_processor = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_convert_rgb": True,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "min_pixels": 56 * 56,
        "max_pixels": 112 * 112,
        "size": {"shortest_edge": 56 * 56, "longest_edge": 112 * 112},
    }
    (out / "preprocessor_config.json").write_text(json.dumps(image_processor, indent=2))
    (out / "processor_config.json").write_text(
        json.dumps({"processor_class": "Qwen2VLProcessor"}, indent=2)
    )


def _patch_config(path: Path, spec: TinySpec) -> None:
    """Add the fields that SGLang 0.5.23 reads but transformers 5.19 does not save:
    ``vision_config.in_chans`` and a top-level ``rope_scaling`` with the M-RoPE
    sections."""
    cfg = json.loads(path.read_text())
    cfg["vision_config"]["in_chans"] = cfg["vision_config"].get("in_channels", 3)
    rope = {"type": "mrope", "rope_type": "default", "mrope_section": list(spec.mrope_section)}
    cfg["rope_scaling"] = rope
    cfg["text_config"]["rope_scaling"] = rope
    path.write_text(json.dumps(cfg, indent=2))


def build_tiny_adapters(model_dir: Path | str, out: Path | str, seed: int = 0) -> dict[str, Path]:
    """Save the adapters of :data:`ADAPTERS` with ``peft`` (non-zero B) under ``out``."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2VLForConditionalGeneration

    out = Path(out)
    paths = {}
    for index, (name, (rank, alpha, targets)) in enumerate(sorted(ADAPTERS.items())):
        path = out / name
        paths[name] = path
        if (path / "adapter_model.safetensors").exists():
            continue
        base = Qwen2VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
        config = LoraConfig(
            r=rank,
            lora_alpha=alpha,
            target_modules=list(targets),
            lora_dropout=0.0,
            bias="none",
        )
        model = get_peft_model(base, config)
        generator = torch.Generator().manual_seed(seed * 1000 + index + 1)
        with torch.no_grad():
            for pname, param in sorted(model.named_parameters()):
                if "lora_A" in pname or "lora_B" in pname:
                    param.copy_(torch.randn(param.shape, generator=generator) / param.shape[-1] ** 0.5)
        model.save_pretrained(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".cache/tiny", help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = build_tiny_model(Path(args.out) / "model", seed=args.seed)
    adapters = build_tiny_adapters(model, Path(args.out) / "adapters", seed=args.seed)
    print(json.dumps({"model": str(model), "adapters": {k: str(v) for k, v in adapters.items()}}))


if __name__ == "__main__":
    main()
