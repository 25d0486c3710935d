"""A corpus of bad input across every endpoint a client reaches: ``/generate``,
``/v1/chat/completions``, ``/v1/completions``, ``/vlora/mode``, ``/vlora/status``,
``/load_lora_adapter`` and broken adapter packages. Each case asserts the status, the reason
(the field and the fix) and that a good request still answers afterwards. Several of these
crashed the server before the plugin checked them (empty prompt, token ids outside the
vocabulary, a misfit adapter, a decompression bomb)."""

from __future__ import annotations

import base64
import http.client
import json
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.reliability.conftest import ADMIN, TEXT, USER, assert_serving
from tests.reliability.packages import BAD_PACKAGES, build
from tests.server.reference import chat_text, make_image, png_base64

IMAGE_TEXT = chat_text("Describe the picture.", with_image=True)
GOOD_IMAGE = "data:image/png;base64," + png_base64(make_image(seed=1))
SP = {"max_new_tokens": 2}


def png_header(width: int, height: int) -> str:
    """A ~70-byte PNG whose header declares ``width`` x ``height`` pixels."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(png).decode()


@dataclass(frozen=True)
class Case:
    kind: str
    path: str
    body: Any = None
    status: int = 400
    reason: str = ""
    method: str = "POST"
    headers: dict = field(default_factory=lambda: USER)
    raw: bytes | None = None


def gen(kind: str, reason: str, status: int = 400, **body: Any) -> Case:
    return Case(kind, "/generate", {"sampling_params": SP, **body}, status, reason)


def chat(kind: str, reason: str, messages: Any = None, **extra: Any) -> Case:
    body = {"model": "default", "max_tokens": 2, **extra}
    if messages is not None:
        body["messages"] = messages
    return Case(kind, "/v1/chat/completions", body, 400, reason)


def image_message(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "x"}]}]


def mode(kind: str, body: Any, reason: str, status: int = 400, headers: dict = ADMIN, raw: bytes | None = None) -> Case:
    return Case(kind, "/vlora/mode", body, status, reason, headers=headers, raw=raw)


def load(kind: str, name: str, path: str, reason: str, status: int = 400, headers: dict = ADMIN) -> Case:
    return Case(kind, "/load_lora_adapter", {"lora_name": name, "lora_path": path}, status, reason, headers=headers)


HI = [{"role": "user", "content": "hi"}]
CASES = [
    # /generate: input SGLang's scheduler crashed on, or lost
    gen("text-empty", "text is empty", text=""),
    gen("text-empty-in-batch", "text[1] is empty", text=["hi", ""]),
    gen("input-ids-empty", "input_ids cannot be empty", input_ids=[]),
    gen("input-ids-outside-vocab", "input_ids[2] = 99999 is not a token id of this model", input_ids=[1, 2, 99999]),
    gen("input-ids-negative", "input_ids[0] = -1 is not a token id", input_ids=[-1, 3]),
    gen("input-ids-outside-vocab-in-batch", "input_ids[1][0] = 5000", input_ids=[[1, 2], [5000]]),
    gen("input-ids-float", "elements must be int", input_ids=[1.5]),
    gen("custom-params-string", "custom_params must be an object", text="hi", sampling_params={**SP, "custom_params": "x"}),
    gen("custom-params-list", "custom_params must be an object", text="hi", sampling_params={**SP, "custom_params": [1]}),
    gen("custom-params-number", "custom_params must be an object", text="hi", sampling_params={**SP, "custom_params": 3}),
    gen("head-on-adapter-without-head", "has no task head", text="hi", lora_path="a8",
        sampling_params={**SP, "custom_params": {"vlora_head": True}}),
    gen("head-without-adapter", "needs an adapter", text="hi", sampling_params={**SP, "custom_params": {"vlora_head": True}}),
    gen("head-value", "must be true or a task name", text="hi", lora_path="a8",
        sampling_params={**SP, "custom_params": {"vlora_head": 3}}),
    gen("application-not-text", "custom_params.vlora_app must be", text="hi",
        sampling_params={**SP, "custom_params": {"vlora_app": 5}}),
    gen("slo-negative", "custom_params.vlora_slo_ms must be", text="hi",
        sampling_params={**SP, "custom_params": {"vlora_slo_ms": -1}}),
    gen("adapter-unknown", "never been loaded: no_such_adapter", text="hi", lora_path="no_such_adapter"),
    gen("adapter-list-too-short", "lora_path has 1 entries for 2 prompts", text=["hi", "ho"], lora_path=["a8"]),
    gen("modalities-list-too-short", "modalities has 1 entries for 2 prompts", text=["hi", "ho"], modalities=["image"]),
    gen("image-decompression-bomb", "--vlora-max-image-pixels", text=IMAGE_TEXT, image_data=png_header(20000, 20000)),
    gen("image-above-pixel-limit", "9000 x 9000 = 81000000 pixels is above", text=IMAGE_TEXT, image_data=png_header(9000, 9000)),
    gen("images-more-than-placeholders", "has 1 image placeholder(s)", text=IMAGE_TEXT, image_data=[GOOD_IMAGE, GOOD_IMAGE]),
    gen("image-without-placeholder", "has 0 image placeholder(s)", text="Describe.", image_data=GOOD_IMAGE),
    gen("image-not-an-image", "Could not decode image", text=IMAGE_TEXT, image_data="data:image/png;base64,bm90IGFuIGltYWdl"),
    gen("image-not-base64", "image", text=IMAGE_TEXT, image_data="data:image/png;base64,%%%not-base64%%%"),
    gen("image-a-number", "image_data: invalid type", text=IMAGE_TEXT, image_data=5),
    gen("prompt-missing", "Either text, input_ids or input_embeds should be provided"),
    gen("text-a-number", "text", text=5),
    gen("sampling-params-string", "sampling_params", text="hi", sampling_params="x"),
    gen("max-new-tokens-negative", "max_new_tokens must be at least 0", text="hi", sampling_params={"max_new_tokens": -1}),
    gen("max-new-tokens-text", "sampling_params.max_new_tokens: invalid type", text="hi", sampling_params={"max_new_tokens": "many"}),
    gen("max-new-tokens-beyond-context", "maximum context length", text="hi", sampling_params={"max_new_tokens": 10**9}),
    gen("prompt-beyond-context", "longer than the model's context length", input_ids=[5] * 5000),
    gen("temperature-negative", "temperature must be a non-negative", text="hi", sampling_params={**SP, "temperature": -1}),
    gen("top-p-above-one", "top_p must be in (0, 1]", text="hi", sampling_params={**SP, "top_p": 2}),
    gen("top-k-negative", "top_k must be -1", text="hi", sampling_params={**SP, "top_k": -5}),
    gen("frequency-penalty", "frequency_penalty must be in [-2, 2]", text="hi", sampling_params={**SP, "frequency_penalty": 9}),
    gen("adapter-list-of-null-for-one-prompt", "lora_path is a list of 1 for one prompt", text="hi", lora_path=[None]),
    gen("adapter-list-for-one-prompt", "lora_path is a list of 1 for one prompt", text="hi", lora_path=["a8"]),
    gen("adapter-empty-list-for-one-prompt", "lora_path is a list of 0 for one prompt", text="hi", lora_path=[]),
    gen("hidden-states-list-for-one-prompt", "return_hidden_states is a list of 0 for one prompt", text="hi",
        return_hidden_states=[]),
    gen("rid-list-for-one-prompt", "rid is a list of 1 for one prompt", text="hi", rid=["r1"]),
    Case("sampling-params-list-for-one-prompt", "/generate", {"text": "hi", "sampling_params": [SP]}, 400,
         "sampling_params is a list of 1 for one prompt"),
    Case("sampling-params-empty-list", "/generate", {"text": "hi", "sampling_params": []}, 400,
         "sampling_params is an empty list"),
    gen("session-params-unknown-field", "session_params has unknown field(s) ['a']", text="hi", session_params={"a": 1}),
    gen("samples-null", "sampling_params.n must be a whole number", text="hi", sampling_params={**SP, "n": None}),
    gen("sampling-param-unknown", "unknown field `bogus`", text="hi", sampling_params={**SP, "bogus": 1}),
    gen("stop-a-number", "sampling_params.stop: invalid type", text="hi", sampling_params={**SP, "stop": 5}),
    Case("body-a-list", "/generate", [1, 2], 400, "Input should be a dictionary"),
    Case("body-not-json", "/generate", None, 400, "JSON decode error", raw=b"{oops"),
    Case("chat-body-not-json", "/v1/chat/completions", None, 400, "JSON decode error", raw=b"{oops"),
    Case("chat-body-a-list", "/v1/chat/completions", [1, 2], 400, "the body does not fit the request schema"),
    Case("chat-body-a-number", "/v1/chat/completions", 3, 400, "the body does not fit the request schema"),
    chat("chat-response-format-string", "the body does not fit the request schema", HI, response_format="json"),
    chat("chat-json-schema-a-string", "the body does not fit the request schema", HI,
         response_format={"type": "json_schema", "schema": "x"}),
    Case("generate-without-key", "/generate", {"text": "hi", "sampling_params": SP}, 401, "Unauthorized", headers={}),
    Case("generate-with-admin-key", "/generate", {"text": "hi", "sampling_params": SP}, 401, "Unauthorized", headers=ADMIN),
    # OpenAI chat and completions
    chat("chat-messages-empty", "Messages cannot be empty", []),
    chat("chat-messages-missing", "messages"),
    chat("chat-adapter-unknown", "never been loaded: nope", HI, model="default:nope"),
    chat("chat-max-tokens-negative", "max_new_tokens must be at least 0", HI, max_tokens=-1),
    chat("chat-role-unknown", "role", [{"role": "wizard", "content": "hi"}]),
    chat("chat-image-bomb", "--vlora-max-image-pixels", image_message(png_header(20000, 20000))),
    chat("chat-image-not-an-image", "Could not decode image", image_message("data:image/png;base64,bm90IGFuIGltYWdl")),
    chat("chat-custom-params-string", "custom_params", HI, custom_params="x"),
    chat("chat-temperature-negative", "temperature must be a non-negative", HI, temperature=-3),
    chat("chat-head-on-adapter-without-head", "has no task head", HI, model="default:a8", custom_params={"vlora_head": True}),
    Case("completion-prompt-empty", "/v1/completions", {"model": "default", "prompt": "", "max_tokens": 2}, 400, "Prompt cannot be empty"),
    Case("completion-ids-outside-vocab", "/v1/completions", {"model": "default", "prompt": [99999], "max_tokens": 2}, 400,
         "input_ids[0] = 99999 is not a token id"),
    # /vlora/mode and /vlora/status
    mode("mode-unknown", {"mode": "fold", "adapter": "a8"}, "mode must be one of"),
    mode("mode-adapter-unknown", {"mode": "merge", "adapter": "nope"}, "unknown adapter 'nope'"),
    mode("mode-merge-without-adapter", {"mode": "merge"}, "needs the adapter"),
    mode("mode-unmerge-with-adapter", {"mode": "unmerge", "adapter": "a8"}, "takes no adapter"),
    mode("mode-a-number", {"mode": 3}, "mode must be a string"),
    mode("mode-body-a-list", [1, 2], "the body must be"),
    mode("mode-body-not-json", None, "the body must be JSON", raw=b"{oops"),
    mode("mode-unknown-field", {"mode": "unmerge", "adapters": "a8"}, "unknown field(s) ['adapters']"),
    mode("mode-wait-negative", {"mode": "unmerge", "wait_s": -1}, "wait_s must be a number of seconds"),
    mode("mode-wait-too-long", {"mode": "unmerge", "wait_s": 1000}, "wait_s must be a number of seconds"),
    mode("mode-with-user-key", {"mode": "unmerge"}, "Unauthorized", 401, headers=USER),
    mode("mode-without-key", {"mode": "unmerge"}, "Unauthorized", 401, headers={}),
    Case("mode-get", "/vlora/mode", None, 405, "Method Not Allowed", method="GET"),
    Case("status-wrong-key", "/vlora/status", None, 401, "Unauthorized", method="GET",
         headers={"Authorization": "Bearer wrong"}),
    Case("status-post", "/vlora/status", None, 405, "Method Not Allowed", headers=ADMIN),
    # /load_lora_adapter and /unload_lora_adapter (packages: see BAD_PACKAGES below)
    load("adapter-name-empty", "", "{a8}", "lora_name '' is not a valid adapter name"),
    load("adapter-name-path", "../x", "{a8}", "lora_name '../x' is not a valid adapter name"),
    load("adapter-name-space", "a b", "{a8}", "lora_name 'a b' is not a valid adapter name"),
    load("adapter-name-taken", "a8", "{a8}", "a8 because it is already loaded"),
    load("adapter-path-missing", "missing", "{tmp}/does_not_exist", "no such folder"),
    load("adapter-path-not-on-the-hub", "hub", "someorg/no-such-repo", "fetching it as a Hugging Face repo failed"),
    load("adapter-load-with-user-key", "u", "{a8}", "Unauthorized", 401, headers=USER),
    Case("adapter-unload-unknown", "/unload_lora_adapter", {"lora_name": "nope"}, 400, "nope does not exist", headers=ADMIN),
]


def _send(server, case: Case, tmp_path) -> httpx.Response:
    body = case.body
    if isinstance(body, dict) and case.path == "/load_lora_adapter":
        body = {k: v.format(a8=server.adapters["a8"], tmp=tmp_path) for k, v in body.items()}
    if case.raw is not None:
        headers = {**case.headers, "content-type": "application/json"}
        return httpx.post(server.url + case.path, content=case.raw, headers=headers, timeout=60)
    if case.method == "GET":
        return httpx.get(server.url + case.path, headers=case.headers, timeout=60)
    return httpx.post(server.url + case.path, json=body, headers=case.headers, timeout=60)


@pytest.mark.parametrize("case", CASES, ids=[c.kind for c in CASES])
def test_bad_request_gets_a_reason_and_the_server_keeps_serving(guarded, case, tmp_path):
    response = _send(guarded, case, tmp_path)
    assert response.status_code == case.status, response.text
    assert case.reason in response.text, response.text
    assert_no_server_source(response.text)
    assert_serving(guarded)


def assert_no_server_source(text: str) -> None:
    """An answer names the bad field, never where the server's code lives (FastAPI's validation
    errors end with the endpoint's source file and line unless the plugin takes them out)."""
    assert 'File \\"' not in text and "site-packages" not in text and ".py" not in text, text


@pytest.mark.parametrize("bad", BAD_PACKAGES, ids=[b.kind for b in BAD_PACKAGES])
def test_bad_package_fails_its_load_with_the_reason_the_check_gives(guarded, bad, tmp_path):
    root = build(bad, guarded.adapters["a8"], tmp_path)
    response = httpx.post(
        guarded.url + "/load_lora_adapter", json={"lora_name": f"bad-{bad.kind}", "lora_path": str(root)},
        headers=ADMIN, timeout=60,
    )
    assert response.status_code == 400, response.text
    assert bad.reason in json.loads(response.text)["error_message"]
    assert_serving(guarded)


def test_the_corpus_covers_sixty_kinds():
    assert len(CASES) + len(BAD_PACKAGES) >= 60


# Streamed requests refused before SGLang registered them: normalisation raised (is_single never
# set), a single prompt's list rid, and a field SGLang itself refuses after normalising. The
# stream's abort task used to raise 2 s after such a stream ended, and uvicorn then closed the
# connection, cutting the answer to the next request on it.
STREAMED_REFUSALS = [
    ("/generate", {"text": "hi", "stream": True, "sampling_params": []}, "sampling_params"),
    ("/generate", {"text": "hi", "stream": True, "rid": ["x"], "sampling_params": {"max_new_tokens": 2}}, "rid"),
    ("/v1/completions", {"model": "default", "prompt": "hi", "stream": True, "max_tokens": 2, "rid": ["x"]}, "rid"),
]


@pytest.mark.parametrize("path,body,field", STREAMED_REFUSALS, ids=[f"{p}-{f}" for p, _, f in STREAMED_REFUSALS])
def test_a_refused_streamed_request_leaves_its_connection_serving(guarded, path, body, field):
    host, port = guarded.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {**USER, "Content-Type": "application/json"}
    try:
        connection.request("POST", path, json.dumps(body), headers)
        refused = connection.getresponse()
        text = refused.read().decode()
        assert refused.status == 400 or (refused.status == 200 and '"error"' in text), text
        assert field in text, text
        time.sleep(3)  # past the abort task's 2 s, within uvicorn's 5 s keep-alive
        good = {"text": TEXT, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        connection.request("POST", "/generate", json.dumps(good), headers)
        answer = connection.getresponse()
        assert answer.status == 200, answer.read()
        assert json.loads(answer.read())["meta_info"]["completion_tokens"] == 1
    finally:
        connection.close()
    assert_serving(guarded)


# Refused before SGLang counted the adapter's use: its release of the use raised in a background
# task and logged a traceback for each such request.
UNCOUNTED = [
    {"text": "hi", "lora_path": "no_such_adapter", "sampling_params": SP},
    {"text": "hi", "lora_path": "a8", "sampling_params": {**SP, "custom_params": {"vlora_head": True}}},
]


def test_a_request_refused_before_its_adapter_was_counted_leaves_no_failed_release(guarded):
    start = guarded.log_path.stat().st_size
    for body in UNCOUNTED:
        response = httpx.post(guarded.url + "/generate", json=body, headers=USER, timeout=60)
        assert response.status_code == 400, response.text
    assert_serving(guarded)  # the release task of the last refusal has run by the time this answers
    with guarded.log_path.open(errors="replace") as log:
        log.seek(start)
        written = log.read()
    assert "never been loaded" in written and "has no task head" in written, written
    assert "Task exception was never retrieved" not in written and "Traceback" not in written, written


GENERATE_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")


def test_the_corpus_streamed_gets_its_reasons_and_no_failed_task(guarded):
    """Every generate case of the corpus again with ``"stream": true``: SGLang answers a refusal
    either before the stream (the 4xx) or as an error event in a 200 stream; either way the reason
    is there, and the server logs no failed handler or background task."""
    start = guarded.log_path.stat().st_size
    streamed = [c for c in CASES if c.path in GENERATE_PATHS and isinstance(c.body, dict) and c.raw is None]
    assert len(streamed) >= 50
    failures = []
    with httpx.Client(timeout=60) as client:
        for case in streamed:
            try:
                response = client.post(guarded.url + case.path, json={**case.body, "stream": True}, headers=case.headers)
                status, text = response.status_code, response.text
            except httpx.TransportError as exc:
                status, text = repr(exc), ""
            # streamed, an OpenAI request for a head answer is refused before its other checks run
            asks_head = case.path != "/generate" and "vlora_head" in str(case.body.get("custom_params"))
            reason = "cannot carry a head's answer" if asks_head else case.reason
            if not isinstance(status, int) or status >= 500 or reason not in text:
                failures.append((case.kind, status, text[:300]))
    assert not failures, failures
    assert_serving(guarded)
    with guarded.log_path.open(errors="replace") as log:
        log.seek(start)
        written = log.read()
    assert "Traceback" not in written, written[written.index("Traceback") - 500:][:3000]
