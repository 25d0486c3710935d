"""Input that must never reach SGLang's scheduler unchecked: the glue between SGLang and the
plain checks of :mod:`sglang_vlora.request_check` and :func:`sglang_vlora.adapters.check_package`.
Declared, with their reasons, in :mod:`sglang_vlora.sglang_hooks`; each hook takes the
process's :class:`~sglang_vlora.runtime.VLoRARuntime` first.

* HTTP server, per request: a non-empty prompt, token ids inside the vocabulary, ``custom_params``
  an object, one image placeholder per image (SGLang crashes on the first two, answers 500 to
  the third and drops extra images); around SGLang's normalisation of a generate request, the
  shapes it reads unchecked (:func:`normalize_request_around`): one value in a single prompt's
  per-request fields (a list ``lora_path`` or ``return_hidden_states`` stopped the scheduler
  process), one entry per prompt in a batch's lists, sampling params and session params that it
  can read (500s before);
  SGLang's own schema errors get the name of the field; then the task-head and application /
  SLO fields (:mod:`sglang_vlora.heads.head_requests`, :func:`sglang_vlora.request_check.check_application_and_slo`);
  a streamed request refused that way no longer breaks its connection for the next request on it
  (:func:`abort_task_around`), and a request refused before its adapters' use was counted no
  longer logs a failed release (:func:`release_lora_around`);
* HTTP server, profiling: a ``/start_profile`` request the scheduler would stop on (an activity
  this server cannot record, a trace folder it cannot create) or record nothing for (an unknown
  activity) is a 400 (:mod:`sglang_vlora.profile_check`), and the scheduler's failed answers
  are no longer 500s with a traceback: no profile to stop is a 400, a profiler that failed a 500
  with its message;
* HTTP server, per image: at most ``--vlora-max-image-pixels`` pixels, checked from the header
  before the image is decoded (Pillow's decompression-bomb error was a 500);
* scheduler, per adapter load (start-up, ``/load_lora_adapter``, reload after eviction, tensors
  sent to ``/load_lora_adapter_from_tensors``): the package check against the model (every
  tensor's shape, dtype, finiteness; rank; target modules; heads) before SGLang reads it, so a
  misfit adapter fails its load with the reason instead of crashing the first request that
  uses it; ``--lora-target-modules all`` means the modules atmm serves;
* HTTP server, auth: ``/vlora/status`` answers either configured key (SGLang's levels have no
  "any key" level); ``/vlora/mode`` carries SGLang's ``ADMIN_OPTIONAL`` level itself.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from http import HTTPStatus

from fastapi import HTTPException
from starlette.background import BackgroundTasks

from sglang_vlora import profile_check, request_check
from sglang_vlora.adapters import AdapterError, ModelShapes, check_lora, check_package
from sglang_vlora.heads.head_requests import check_head_request
from sglang_vlora.http_api import ANY_KEY_ROUTES
from sglang_vlora.runtime import VLoRARuntime

logger = logging.getLogger(__name__)

# What the atmm backend cannot serve (SGLang's "all" adds them).
EMBEDDING_TARGETS = frozenset({"embed_tokens", "lm_head"})
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


# ------------------------------------------------------------------- HTTP server
def _check_request(tokenizer_manager, obj) -> None:
    """Raise :class:`~sglang_vlora.request_check.RequestError` for input SGLang cannot serve.
    ``obj`` is a normalized ``GenerateReqInput`` or ``EmbeddingReqInput``."""
    request_check.check_custom_params(getattr(obj, "sampling_params", None))
    is_single = bool(obj.is_single)
    request_check.check_prompts(obj.text, obj.input_ids, is_single, int(tokenizer_manager.model_config.vocab_size))
    tokens = getattr(getattr(tokenizer_manager, "mm_processor", None), "mm_tokens", None)
    if tokens is not None:
        placeholder = tokens.image_token if isinstance(tokens.image_token, str) else str(tokens.image_token)
        request_check.check_image_tokens(
            obj.text, getattr(obj, "image_data", None), is_single, tokens.image_token_regex, placeholder
        )


def _per_request(obj) -> list[tuple[dict, str | None]]:
    """(sampling params dict, adapter name) of each request of a GenerateReqInput."""
    texts = obj.text if obj.text is not None else obj.input_ids
    batch = isinstance(texts, list) and texts and not isinstance(texts[0], int)
    n = len(texts) if batch else 1
    params = obj.sampling_params
    if params is None:
        params = {}
        obj.sampling_params = params
    param_list = params if isinstance(params, list) else [params] * n
    adapters = obj.lora_path if isinstance(obj.lora_path, list) else [obj.lora_path] * n
    return list(zip(param_list, adapters, strict=False))


def _lora_path(tokenizer_manager, adapter: str) -> str | None:
    """The folder of an adapter SGLang knows by name (None: it does not)."""
    ref = tokenizer_manager.lora_registry._registry.get(adapter) or tokenizer_manager.lora_ref_cache.get(adapter)
    return None if ref is None else ref.lora_path


async def validate_requests_around(rt: VLoRARuntime, original, self, obj) -> None:
    """AROUND ``TokenizerManager._validate_and_resolve_lora`` (every generate request): our
    checks first (input SGLang cannot serve, task-head and application / SLO fields), so a
    refused request holds no adapter reference; then SGLang's. A valid head request is made
    to finish after prefill."""
    _check_request(self, obj)
    for params, adapter in _per_request(obj):
        if isinstance(params, dict):
            check_head_request(params, adapter, lambda name: _lora_path(self, name))
    request_check.check_application_and_slo(obj.sampling_params)
    await original(self, obj)


def _session_fields() -> tuple[str, ...]:
    from sglang.srt.managers.io_struct import SessionParams

    return SessionParams.__struct_fields__


def normalize_request_around(rt: VLoRARuntime, original, self, *args, **kwargs):
    """AROUND ``GenerateReqInput.normalize_batch_and_arguments``: before, the sampling params'
    shape, which SGLang reads first (an empty list or ``"n": null`` was a 500), and the session
    params' fields (an unknown one was a 500); after, one value in each per-request field of a
    single prompt (SGLang keys the request by its rid right after this, and its scheduler died
    on a list lora_path or return_hidden_states), and one entry per prompt in a batch's lists,
    which SGLang indexes right after this (an IndexError, a 500, for a short list)."""
    request_check.check_sampling_params_shape(self.sampling_params)
    if self.session_params is not None:
        request_check.check_session_params(self.session_params, _session_fields())
    result = original(self, *args, **kwargs)
    if self.is_single:
        request_check.check_single_values({name: getattr(self, name, None) for name in request_check.SINGLE_VALUES})
    else:
        prompts = int(self.batch_size) * int(getattr(self, "parallel_sample_num", 1) or 1)
        request_check.check_batch_lists({name: getattr(self, name, None) for name in request_check.BATCH_LISTS}, prompts)
    return result


def abort_task_around(rt: VLoRARuntime, original, self, obj):
    """AROUND ``TokenizerManager.create_abort_task``, the background task of SGLang's streamed
    answers: 2 s after a stream ends it reads ``obj.is_single`` and looks each rid up. For a
    streamed request refused before SGLang registered it (its normalisation raised, so
    ``is_single`` was never set, or a check refused a list rid) that raised, and uvicorn then
    closed the connection, cutting the answer of whatever the client had sent next on it. Such
    a request has nothing to abort: SGLang's task runs only for a request whose rids it may
    have registered (:func:`registered_rids`)."""
    sglang_task = original(self, obj)
    guarded = BackgroundTasks()
    guarded.add_task(_abort_if_registered, sglang_task, obj)
    return guarded


async def _abort_if_registered(sglang_task: BackgroundTasks, obj) -> None:
    if registered_rids(getattr(obj, "is_single", None), getattr(obj, "rid", None)) is not None:
        await sglang_task()


def release_lora_around(rt: VLoRARuntime, original, self, state):
    """AROUND ``TokenizerManager._release_lora_once``: a request refused before SGLang counted
    its adapters' use (an adapter never loaded, or a check of :func:`validate_requests_around`)
    has no ``lora_id``, and SGLang's release of it raised in a background task, logging a
    traceback for every such request. Nothing was counted, so there is nothing to release."""
    if getattr(state.obj, "lora_id", None) is None:
        return None
    return original(self, state)


def registered_rids(is_single: bool | None, rid) -> list[str] | None:
    """The rids SGLang may have registered for a normalised request: one string for a single
    prompt, a list of strings for a batch. None where it registered none: normalisation did not
    finish (``is_single`` unset) or the rid has a shape the checks refuse."""
    if is_single is None:
        return None
    rids = [rid] if is_single else rid
    if not isinstance(rids, list) or not all(isinstance(r, str) for r in rids):
        return None
    return rids


def contract_error_around(rt: VLoRARuntime, original, body):
    """AROUND ``sglang.srt.entrypoints.api_contract.generate_contract_error``: SGLang's schema
    error names the expected type but not the field ("invalid type: string "many", expected
    i64"); prefix the field it is about, found by checking the fields one at a time."""
    error = original(body)
    if error is None or not isinstance(body, dict):
        return error
    for key, value in body.items():
        if key == "sampling_params":
            entries = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
            for i, entry in entries:
                for name, item in entry.items() if isinstance(entry, dict) else ():
                    if original({"sampling_params": {name: item}}) is not None:
                        where = "sampling_params" if i is None else f"sampling_params[{i}]"
                        return f"{where}.{name}: {error}"
        if original({key: value}) is not None:
            return f"{key}: {error}"
    return error


async def start_profile_around(rt: VLoRARuntime, original, self, req=None):
    """AROUND ``TokenizerManager.start_profile`` (``/start_profile``): a request the scheduler
    would stop on, or record nothing for, is a 400 (:mod:`sglang_vlora.profile_check`)."""
    if req is None:
        from sglang.srt.managers.io_struct import ProfileReq

        req = ProfileReq()
    try:
        profile_check.check_profile_request(req, profile_check.runnable_activities())
    except profile_check.ProfileRequestError as e:
        raise HTTPException(status_code=HTTPStatus.BAD_REQUEST, detail=f"profile not started: {e}") from None
    return await original(self, req)


async def profile_result_around(rt: VLoRARuntime, original, self, req):
    """AROUND ``TokenizerManager._execute_profile``: the scheduler's failed answer raised
    ``RuntimeError``, a 500 with a traceback in the log. Now the scheduler's message with a status
    that says whose fault it was (:func:`profile_check.failed_answer_status`): 400 for a stop with
    no profile running, 409 for a start while one runs, 500 for a profiler that failed."""
    try:
        return await original(self, req)
    except RuntimeError as e:
        message = str(e)
        status = profile_check.failed_answer_status(message)
        if status == HTTPStatus.INTERNAL_SERVER_ERROR:
            message = f"the profiler failed: {message}"
        raise HTTPException(status_code=status, detail=message) from None


def load_image_around(rt: VLoRARuntime, original, *args, **kwargs):
    """AROUND ``sglang.srt.utils.common._load_image``: Pillow refuses to open an image whose
    header declares a decompression bomb; that is the client's error (400), not the server's."""
    from PIL import Image

    try:
        return original(*args, **kwargs)
    except Image.DecompressionBombError as exc:
        raise request_check.image_too_large(rt.config.max_image_pixels) from exc


def image_size_around(rt: VLoRARuntime, original, image):
    """AROUND ``sglang.srt.utils.common._fully_load_pil_image``: refuse an image above the
    pixel limit from its header, before its pixels are decoded."""
    request_check.check_image_size(int(image.width), int(image.height), rt.config.max_image_pixels)
    return original(image)


def decide_auth_around(rt: VLoRARuntime, original, *args, **kwargs):
    """AROUND ``sglang.srt.utils.auth.decide_request_auth``: the read-only plugin routes accept
    any configured key (SGLang's NORMAL level takes only ``--api-key``, its admin levels only
    ``--admin-api-key``); everything else is SGLang's decision."""
    if kwargs.get("path") not in ANY_KEY_ROUTES or kwargs.get("method") == "OPTIONS":
        return original(*args, **kwargs)
    from sglang.srt.utils.auth import AuthDecision

    keys = [key for key in (kwargs.get("api_key"), kwargs.get("admin_api_key")) if key]
    if not keys:
        return AuthDecision(allowed=True)
    scheme, _, token = (kwargs.get("authorization_header") or "").partition(" ")
    allowed = scheme.lower() == "bearer" and any(secrets.compare_digest(token, key) for key in keys)
    return AuthDecision(allowed=allowed)


# ------------------------------------------------------------------ scheduler
def _local_package(lora_path: str) -> str:
    """The folder of an adapter: ``lora_path`` itself, or a Hugging Face repo's snapshot
    (SGLang would fetch it next; fetching it first lets it be checked)."""
    if os.path.isdir(lora_path) or not _HUB_ID.match(lora_path) or lora_path.startswith("."):
        return lora_path
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(lora_path)
    except Exception as exc:  # offline, unknown repo, no access: all mean "cannot load"
        raise AdapterError(
            f"lora_path {lora_path!r}: not a local folder, and fetching it as a Hugging Face repo failed "
            f"({type(exc).__name__}); give the folder holding adapter_config.json"
        ) from exc


def _model_shapes(lora_manager) -> ModelShapes | None:
    """The model's shapes, or None (with a warning) for a config that does not give them:
    then tensors are checked without the model, never refused for it."""
    try:
        return ModelShapes.from_config(lora_manager.base_hf_config)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        logger.warning("sglang-vlora: adapter tensors are not checked against the model (%r)", exc)
        return None


def _refusal(lora_manager, lora_ref, check) -> object | None:
    """Run ``check``; a failed load result saying why, or None when it passes. Like SGLang's
    own load, any error fails the load: none may stop the scheduler."""
    try:
        request_check.check_adapter_name(lora_ref.lora_name)
        check(
            _model_shapes(lora_manager),
            getattr(lora_manager, "max_lora_rank", None),
            getattr(lora_manager, "target_modules", None) or None,
        )
    except Exception as exc:  # every reason is the load's answer, as in SGLang's own load
        reason = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        logger.warning("sglang-vlora: refused adapter %r: %s", lora_ref.lora_name, reason)
        return lora_manager.create_lora_update_result(success=False, error_message=f"adapter {lora_ref.lora_name!r}: {reason}")
    return None


def check_adapter_load_around(rt: VLoRARuntime, original, self, lora_ref, *args, **kwargs):
    """AROUND ``LoRAManager._load_lora_adapter``: the package check before SGLang reads the
    adapter; a failure is a failed load (a 400 with the reason; at start-up, an error)."""
    refused = _refusal(self, lora_ref, lambda model, rank, served: check_package(
        _local_package(str(lora_ref.lora_path)), model, rank, served))
    return refused if refused is not None else original(self, lora_ref, *args, **kwargs)


def check_tensor_load_around(rt: VLoRARuntime, original, self, lora_ref, tensors, config_dict, *args, **kwargs):
    """AROUND ``LoRAManager._load_lora_adapter_from_tensors``: the same LoRA check for an
    adapter sent as tensors (``/load_lora_adapter_from_tensors``)."""
    refused = _refusal(self, lora_ref, lambda model, rank, served: check_lora(config_dict, tensors, model, rank, served))
    return refused if refused is not None else original(self, lora_ref, tensors, config_dict, *args, **kwargs)


def served_targets_around(rt: VLoRARuntime, original, self, *args, **kwargs):
    """AROUND ``LoRAManager.init_lora_shapes``: ``--lora-target-modules all`` means, with the
    atmm backend, every linear module it serves (SGLang's "all" adds embeddings and lm_head,
    which atmm refuses, and the server would stop at start)."""
    result = original(self, *args, **kwargs)
    asked = kwargs.get("target_modules", args[1] if len(args) > 1 else None)
    if getattr(self.lora_backend, "name", None) == "atmm" and asked and set(asked) == {"all"}:
        dropped = sorted(self.target_modules & EMBEDDING_TARGETS)
        self.target_modules -= EMBEDDING_TARGETS
        if dropped:
            logger.warning(
                "sglang-vlora: --lora-target-modules all: the atmm backend serves LoRA on %s; "
                "not on %s (use --lora-backend triton for adapters that train them)",
                sorted(self.target_modules), dropped,
            )
    return result
