"""The GPU-scale benchmark model sees images at their real size: a 448 px image is 256
visual tokens and a 672 px one 576, as with Qwen2-VL-7B (the tiny model caps images at
112 px, which would make every "vision-sized" point a 16-token one)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from transformers import AutoImageProcessor

from bench import e2e_assets


@pytest.mark.parametrize(("side", "tokens"), [(448, 256), (672, 576)])
def test_7b_shaped_model_keeps_vision_sized_images(tiny_assets, tmp_path, side: int, tokens: int) -> None:
    model, _ = tiny_assets
    out = e2e_assets.qwen2vl_7b_model(tmp_path / "7b", tokenizer_from=model)
    processor = AutoImageProcessor.from_pretrained(out)
    image = Image.fromarray(np.zeros((side, side, 3), dtype=np.uint8))
    grid = processor(images=[image], return_tensors="pt")["image_grid_thw"][0]
    merge = json.loads((out / "preprocessor_config.json").read_text())["merge_size"]
    assert int(grid.prod()) // merge**2 == tokens
    tiny = AutoImageProcessor.from_pretrained(model)
    tiny_grid = tiny(images=[image], return_tensors="pt")["image_grid_thw"][0]
    assert int(tiny_grid.prod()) // merge**2 == 16  # the cap this test guards against
