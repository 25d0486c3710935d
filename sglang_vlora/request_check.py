"""Checks of client input that SGLang 0.5.23 would otherwise pass to its scheduler, where it
crashes the server (empty prompt, token ids outside the vocabulary) or silently loses data
(more images than image tokens). Pure Python over plain values: no SGLang or torch import.

Each check raises :class:`RequestError` (a ``ValueError``, which SGLang's HTTP layer answers
with a 400) whose message names the field and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

from sglang_vlora.orchestrator.request_params import application_and_slo

# Adapter names: what /load_lora_adapter and --lora-paths accept. Names are addressed in
# requests (lora_path, the OpenAI "model:adapter" suffix) and in logs, never as paths.
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


class RequestError(ValueError):
    """Bad client input; the message names the field and how to fix it."""


def check_adapter_name(name: Any) -> None:
    if not isinstance(name, str) or not ADAPTER_NAME.match(name):
        raise RequestError(
            f"lora_name {name!r} is not a valid adapter name: use 1-128 letters, digits, '_', '-' or '.' "
            "(not starting with '.'; no '/', ':' or spaces)"
        )


def _items(value: Any, is_single: bool) -> list[tuple[str, Any]]:
    """(field suffix, value) of each request of a possibly batched field."""
    if is_single:
        return [("", value)]
    return [(f"[{i}]", v) for i, v in enumerate(value)]


def check_prompts(text: Any, input_ids: Any, is_single: bool, vocab_size: int) -> None:
    """A non-empty prompt per request; every token id inside ``[0, vocab_size)``."""
    if text is not None:
        for suffix, value in _items(text, is_single):
            if isinstance(value, str) and not value:
                raise RequestError(f"text{suffix} is empty: send a prompt of at least one token")
    if input_ids is None:
        return
    for suffix, ids in _items(input_ids, is_single):
        if not isinstance(ids, Sequence) or isinstance(ids, str) or not ids:
            raise RequestError(f"input_ids{suffix} must be a non-empty list of token ids")
        for position, token in enumerate(ids):
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
                raise RequestError(
                    f"input_ids{suffix}[{position}] = {token!r} is not a token id of this model: "
                    f"ids are integers in [0, {vocab_size})"
                )


# Fields of a batch that SGLang indexes per prompt without checking their length (an
# IndexError, a 500, for a short list), with what one entry is.
BATCH_LISTS = {
    "lora_path": "one adapter name (or null) per prompt, or one name for all",
    "modalities": "one entry per prompt",
    "custom_logit_processor": "one entry per prompt",
}


def check_batch_lists(fields: dict[str, Any], prompts: int) -> None:
    """A batch's per-prompt lists (:data:`BATCH_LISTS`) have one entry per prompt."""
    for name, fix in BATCH_LISTS.items():
        value = fields.get(name)
        if isinstance(value, list) and len(value) != prompts:
            raise RequestError(f"{name} has {len(value)} entries for {prompts} prompts: give {fix}")


# Fields of a generate request that hold one value for a single prompt and one per prompt for a
# batch, with what one value is. SGLang passes a single prompt's list on: its scheduler process
# died on a list lora_path (``[null]``, ``["a8"]``) or return_hidden_states (``[]``), and a list
# rid or sampling_params was a 500.
SINGLE_VALUES = {
    "lora_path": "an adapter name or null",
    "rid": "a request id",
    "return_hidden_states": 'true, false or "last"',
    "sampling_params": "an object",
}


def check_single_values(fields: dict[str, Any]) -> None:
    """A single prompt's per-request fields (:data:`SINGLE_VALUES`) are one value, not a list."""
    for name, one in SINGLE_VALUES.items():
        value = fields.get(name)
        if isinstance(value, list):
            raise RequestError(
                f"{name} is a list of {len(value)} for one prompt: give {one}; "
                "a list gives one per prompt of a batch"
            )


def check_sampling_params_shape(sampling_params: Any) -> None:
    """What SGLang reads before anything else: an object, or a non-empty list of objects (one per
    prompt of a batch), whose ``n``, where given, is a whole number (null was a 500)."""
    if sampling_params is None:
        return
    entries = sampling_params if isinstance(sampling_params, list) else [sampling_params]
    if not entries:
        raise RequestError("sampling_params is an empty list: give an object, or one object per prompt of a batch")
    for i, params in enumerate(entries):
        where = f"sampling_params[{i}]" if isinstance(sampling_params, list) else "sampling_params"
        if not isinstance(params, dict):
            raise RequestError(f"{where} must be an object, got {type(params).__name__}")
        n = params.get("n", 1)
        if isinstance(n, bool) or not isinstance(n, int):
            raise RequestError(f"{where}.n must be a whole number of samples, got {n!r}")


def check_session_params(session_params: Any, known: Collection[str]) -> None:
    """``session_params`` is an object of SGLang's session fields (an unknown one was a 500)."""
    if not isinstance(session_params, dict):
        raise RequestError(f"session_params must be an object, got {type(session_params).__name__}")
    unknown = sorted(set(session_params) - set(known))
    if unknown:
        raise RequestError(f"session_params has unknown field(s) {unknown}: the fields are {sorted(known)}")


def check_custom_params(sampling_params: Any) -> None:
    """``sampling_params.custom_params`` must be an object (the plugin's fields live in it)."""
    entries = sampling_params if isinstance(sampling_params, list) else [sampling_params]
    for i, params in enumerate(entries):
        where = f"sampling_params[{i}]" if isinstance(sampling_params, list) else "sampling_params"
        if params is None:
            continue
        if not isinstance(params, dict):
            raise RequestError(f"{where} must be an object, got {type(params).__name__}")
        custom = params.get("custom_params")
        if custom is not None and not isinstance(custom, dict):
            raise RequestError(
                f"{where}.custom_params must be an object such as {{\"vlora_head\": true}}, "
                f"got {type(custom).__name__}"
            )


def check_application_and_slo(sampling_params: Any) -> None:
    """The application and latency SLO in each request's ``custom_params``
    (:func:`~sglang_vlora.orchestrator.request_params.application_and_slo`): ``ValueError``
    with the reason for a malformed one."""
    for entry in sampling_params if isinstance(sampling_params, list) else [sampling_params]:
        if isinstance(entry, dict):
            application_and_slo(entry.get("custom_params"))


def _count_images(images: Any) -> int:
    if images is None:
        return 0
    if isinstance(images, list):
        return sum(_count_images(item) for item in images)
    return 1


def check_image_tokens(
    text: Any, image_data: Any, is_single: bool, image_token: re.Pattern | None, placeholder: str
) -> None:
    """As many image placeholders in each prompt as images: SGLang drops the extra images.
    ``image_token`` matches one placeholder of the model (``placeholder``)."""
    if image_token is None or text is None or image_data is None:
        return
    texts = _items(text, is_single)
    images = [image_data] if is_single else list(image_data) + [None] * (len(texts) - len(image_data))
    for (suffix, prompt), request_images in zip(texts, images, strict=False):
        if not isinstance(prompt, str):
            continue
        n_images, n_tokens = _count_images(request_images), len(image_token.findall(prompt))
        if n_images != n_tokens:
            raise RequestError(
                f"text{suffix} has {n_tokens} image placeholder(s) {placeholder} but image_data{suffix} "
                f"has {n_images} image(s): put one placeholder in the text per image"
            )


def check_image_size(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise RequestError(
            f"image_data: an image of {width} x {height} = {width * height} pixels is above the server's "
            f"limit of {max_pixels} pixels (--vlora-max-image-pixels): send a smaller image"
        )


def image_too_large(max_pixels: int) -> RequestError:
    """For an image whose header alone trips Pillow's decompression-bomb guard."""
    return RequestError(
        f"image_data: the image's header declares more pixels than the server's limit of {max_pixels} "
        "(--vlora-max-image-pixels) and than Pillow will decode: send a smaller image"
    )
