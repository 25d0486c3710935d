"""sglang_vlora.http_errors on a real FastAPI app shaped like SGLang's: a validation handler that
answers 400 with ``str(exc)``, a request model whose "before" validator reads the body as a dict,
and an endpoint whose own bug raises the same AttributeError. The server-side checks (SGLang's own
app, the OpenAI chat route) are in tests/reliability/test_bad_input.py."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from pydantic import BaseModel, model_validator

from sglang_vlora import http_errors


class Ask(BaseModel):
    prompt: str
    response_format: dict | None = None

    @model_validator(mode="before")
    @classmethod
    def read_format(cls, values):
        fmt = values.get("response_format")  # AttributeError for a body that is not an object
        if fmt:
            "json" + fmt.get("type", "")  # ... or a response_format that is not one (TypeError: a number)
        return values


def make_app(install: bool) -> FastAPI:
    app = FastAPI()

    @app.exception_handler(RequestValidationError)
    async def as_400(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"object": "error", "message": str(exc), "code": 400}, status_code=400)

    @app.post("/ask")
    async def ask(body: Ask) -> dict:
        if body.prompt == "bug":
            return {"n": None.bit_length()}  # the server's own AttributeError
        return {"prompt": body.prompt}

    if install:
        http_errors.install(app)
    return app


def test_without_it_a_body_the_validators_cannot_read_is_a_500():
    client = TestClient(make_app(install=False), raise_server_exceptions=False)
    assert client.post("/ask", json=[1, 2]).status_code == 500


def test_validation_errors_keep_their_reason_and_lose_the_source():
    client = TestClient(make_app(install=True))
    bad_json = client.post("/ask", content=b"{oops", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400
    assert "JSON decode error" in bad_json.json()["message"]
    assert "File " not in bad_json.text and ".py" not in bad_json.text
    missing = client.post("/ask", json={"response_format": None})
    assert missing.status_code == 400 and "prompt" in missing.json()["message"]


def test_a_body_the_validators_cannot_read_is_a_400_with_the_reason():
    client = TestClient(make_app(install=True))
    for body, cause in (([1, 2], "has no attribute 'get'"), (3, "has no attribute 'get'"),
                        ({"prompt": "hi", "response_format": "json"}, "has no attribute 'get'"),
                        ({"prompt": "hi", "response_format": {"type": 5}}, "can only concatenate")):
        answer = client.post("/ask", json=body)
        assert answer.status_code == 400, (body, answer.text)
        message = answer.json()["message"]
        assert "the body does not fit the request schema" in message and cause in message
        assert ".py" not in answer.text
    assert client.post("/ask", json={"prompt": "hi"}).json() == {"prompt": "hi"}


def test_the_servers_own_attribute_error_stays_a_500():
    client = TestClient(make_app(install=True), raise_server_exceptions=False)
    assert client.post("/ask", json={"prompt": "bug"}).status_code == 500


def test_an_app_without_a_validation_handler_keeps_fastapis_422():
    app = FastAPI()

    @app.post("/ask")
    async def ask(body: Ask) -> dict:
        return {"prompt": body.prompt}

    http_errors.install(app)
    client = TestClient(app)
    assert client.post("/ask", json={}).status_code == 422
