"""A request's application and latency SLO, as the client sends them.

They ride in ``sampling_params.custom_params``, the field SGLang carries unchanged from
the HTTP request (native ``/generate`` and OpenAI's ``extra_body``) to the scheduler::

    {"custom_params": {"vlora_app": "retrieval", "vlora_slo_ms": 800}}

``vlora_app`` names the application (metrics, benchmark reports); ``vlora_slo_ms`` is
its latency SLO in milliseconds: starving requests with tighter SLOs are served first.
Both are optional.
"""

from __future__ import annotations

import math
from typing import Any

APP_PARAM = "vlora_app"
SLO_PARAM = "vlora_slo_ms"


def application_and_slo(custom_params: dict[str, Any] | None) -> tuple[str | None, float | None]:
    """``(application, slo in seconds)`` from ``custom_params``; ``ValueError`` with the reason."""
    params = custom_params or {}
    app = params.get(APP_PARAM)
    if app is not None and (not isinstance(app, str) or not app or len(app) > 128):
        raise ValueError(f"custom_params.{APP_PARAM} must be a non-empty string of at most 128 characters")
    slo_ms = params.get(SLO_PARAM)
    if slo_ms is None:
        return app, None
    if isinstance(slo_ms, bool) or not isinstance(slo_ms, int | float) or not math.isfinite(slo_ms) or slo_ms <= 0:
        raise ValueError(f"custom_params.{SLO_PARAM} must be a positive number of milliseconds, got {slo_ms!r}")
    return app, slo_ms / 1e3
