"""How SGLang's HTTP app answers a request body it cannot validate.

SGLang 0.5.23 leaves two gaps there, both closed by :func:`install` on the app before it serves:

* Its 400 for a body that fails FastAPI's validation (not JSON, a list where an object belongs)
  carries ``str(exc)``, and FastAPI's ``str`` ends with the endpoint's source file, line and
  function: every client learned where the server is installed. SGLang's handler now gets the
  same errors without that context, so the answer keeps its shape, status and reason.
* The OpenAI chat request's own "before" validators read the body as a dict of dicts: a body
  that is not a JSON object, or a ``response_format`` that is not one, raised ``AttributeError``
  inside the validation, and the client got a 500 for its own mistake. An ``AttributeError`` or
  ``TypeError`` raised while FastAPI validates a request body is now answered like any other
  validation error, a 400 naming the body; raised anywhere else, it stays the server's 500
  (raised after a streaming answer started, Starlette reports it as a ``RuntimeError`` caused
  by it, since a handler exists for its type).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from types import TracebackType

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

logger = logging.getLogger(__name__)

Handler = Callable[[Request, Exception], Awaitable[Response]]
# The FastAPI function that validates a request body against the endpoint's model.
BODY_VALIDATION = "request_body_to_args"
_FASTAPI_DIR = f"{os.sep}fastapi{os.sep}"


def install(app: FastAPI) -> None:
    """Wrap the app's handler of :class:`RequestValidationError` and let it answer body-validation
    crashes too. Must run before the app's first request (Starlette fixes its handlers then).
    Where the app has no such handler, FastAPI's own 422 (no source in it) stands."""
    validation_handler = app.exception_handlers.get(RequestValidationError)
    if validation_handler is None:
        return
    app.exception_handlers[RequestValidationError] = without_source(validation_handler)
    for crash in (AttributeError, TypeError):
        app.add_exception_handler(crash, body_crash_as_validation_error(validation_handler))


def without_source(validation_handler: Handler) -> Handler:
    """``validation_handler`` given the same errors and body, without the endpoint's context."""

    async def handler(request: Request, exc: RequestValidationError) -> Response:
        return await validation_handler(request, RequestValidationError(exc.errors(), body=exc.body))

    return handler


def body_crash_as_validation_error(validation_handler: Handler) -> Handler:
    """A handler that answers an exception raised while FastAPI validated the request body as a
    validation error of the body, and raises any other again (the server's 500, as before)."""

    async def handler(request: Request, exc: Exception) -> Response:
        if not raised_validating_body(exc.__traceback__):
            raise exc
        logger.info("sglang-vlora: %s %s: a body its validators could not read (%s: %s): 400",
                    request.method, request.url.path, type(exc).__name__, exc)
        error = {"type": "value_error", "loc": ("body",), "msg": f"the body does not fit the request schema ({exc})"}
        return await validation_handler(request, RequestValidationError([error]))

    return handler


def raised_validating_body(tb: TracebackType | None) -> bool:
    """Whether a traceback passes through FastAPI's validation of a request body."""
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == BODY_VALIDATION and _FASTAPI_DIR in code.co_filename:
            return True
        tb = tb.tb_next
    return False
