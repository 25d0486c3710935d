"""Independent reference: HF transformers + peft on the same tiny model, fp32.

Teacher forcing: the prompt plus SGLang's greedy tokens go through the HF model in
one forward; we read the log-prob HF gives each of SGLang's tokens and HF's own
top-1 with its margin over the runner-up.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import httpx
import numpy as np
import torch
from PIL import Image

# fp32 end to end on both sides: measured differences are ~2e-6 (see README).
LOGPROB_TOL = 1e-3


def make_image(seed: int, size: int = 56) -> Image.Image:
    """A deterministic RGB image whose side is a multiple of 28, so neither
    processor resizes it."""
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((size, size, 3)) * 255).astype("uint8"))


def png_base64(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def chat_text(question: str, with_image: bool) -> str:
    vision = "<|vision_start|><|image_pad|><|vision_end|>" if with_image else ""
    return (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{vision}{question}<|im_end|>\n<|im_start|>assistant\n"
    )


@dataclass
class Generation:
    prompt_tokens: int
    tokens: list[int]
    logprobs: list[float]


def sglang_generate(
    url: str, text: str, adapter: str | None, image: Image.Image | None = None, max_new_tokens: int = 8
) -> Generation:
    payload = {
        "text": text,
        "lora_path": adapter,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
        "return_logprob": True,
    }
    if image is not None:
        payload["image_data"] = "data:image/png;base64," + png_base64(image)
    response = httpx.post(url + "/generate", json=payload, timeout=120)
    response.raise_for_status()
    return parse_generation(response.json())


def sglang_generate_batch(url: str, text: str, adapters: list[str | None], max_new_tokens: int = 8) -> list[Generation]:
    """One /generate call with one prompt per adapter: SGLang schedules it as one batch."""
    response = httpx.post(
        url + "/generate",
        json={
            "text": [text] * len(adapters),
            "lora_path": adapters,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
            "return_logprob": True,
        },
        timeout=180,
    )
    response.raise_for_status()
    return [parse_generation(body) for body in response.json()]


def parse_generation(body: dict) -> Generation:
    meta = body["meta_info"]
    return Generation(
        prompt_tokens=meta["prompt_tokens"],
        tokens=[t[1] for t in meta["output_token_logprobs"]],
        logprobs=[t[0] for t in meta["output_token_logprobs"]],
    )


class HFReference:
    """Base model plus each adapter through peft, all in fp32."""

    def __init__(self, model_dir: Path, adapters: dict[str, Path]):
        self.model_dir = model_dir
        self.adapters = adapters

    @cached_property
    def processor(self):
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(self.model_dir)

    @cached_property
    def model(self):
        from peft import PeftModel
        from transformers import Qwen2VLForConditionalGeneration

        base = Qwen2VLForConditionalGeneration.from_pretrained(self.model_dir, dtype=torch.float32)
        names = sorted(self.adapters)
        model = PeftModel.from_pretrained(base, str(self.adapters[names[0]]), adapter_name=names[0])
        for name in names[1:]:
            model.load_adapter(str(self.adapters[name]), adapter_name=name)
        return model.eval()

    def inputs(self, text: str, image: Image.Image | None) -> dict:
        images = [image] if image is not None else None
        return dict(self.processor(text=[text], images=images, return_tensors="pt"))

    @torch.no_grad()
    def teacher_forced(self, text: str, image: Image.Image | None, adapter: str | None, tokens: list[int]):
        """Return (prompt_len, log-probs of ``tokens``, HF top-1 per step, top-1 margin)."""
        inputs = self.inputs(text, image)
        prompt_len = inputs["input_ids"].shape[1]
        extra = torch.tensor([tokens])
        for key, value in list(inputs.items()):
            # Per-token inputs (ids, attention mask, multimodal token types) grow with
            # the generated tokens, which are text.
            if torch.is_tensor(value) and value.dim() == 2 and value.shape == (1, prompt_len):
                fill = extra if key == "input_ids" else torch.full_like(extra, 1 if key == "attention_mask" else 0)
                inputs[key] = torch.cat([value, fill.to(value.dtype)], dim=1)
        if adapter is None:
            with self.model.disable_adapter():
                logits = self.model(**inputs).logits[0]
        else:
            self.model.set_adapter(adapter)
            logits = self.model(**inputs).logits[0]
        logp = torch.log_softmax(logits.float(), dim=-1)[prompt_len - 1 : prompt_len - 1 + len(tokens)]
        top2 = logp.topk(2, dim=-1)
        chosen = logp.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)
        margins = top2.values[:, 0] - top2.values[:, 1]
        return prompt_len, chosen.tolist(), top2.indices[:, 0].tolist(), margins.tolist()


def assert_matches_reference(ref: HFReference, gen: Generation, text: str, image, adapter: str | None) -> None:
    prompt_len, hf_logprobs, hf_top1, margins = ref.teacher_forced(text, image, adapter, gen.tokens)
    assert gen.prompt_tokens == prompt_len, "SGLang and HF tokenized the prompt differently"
    for step, (ours, theirs) in enumerate(zip(gen.logprobs, hf_logprobs, strict=True)):
        assert abs(ours - theirs) <= LOGPROB_TOL, (
            f"adapter={adapter} step {step}: SGLang log-prob {ours:.5f} vs HF {theirs:.5f}"
        )
    for step, (token, top, margin) in enumerate(zip(gen.tokens, hf_top1, margins, strict=True)):
        if margin > LOGPROB_TOL:
            assert token == top, f"adapter={adapter} step {step}: SGLang chose {token}, HF top-1 {top}"
