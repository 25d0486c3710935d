"""Requests the reliability tests send and what they compare: a request spec, its answer
(tokens, log-probs, the top-2 margin per step) and solo runs to compare against."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from tests.reliability.conftest import ADMIN, USER
from tests.server.reference import chat_text, make_image, png_base64

NEAR_TIE = 1e-3
MAX_NEW = 6


@dataclass(frozen=True)
class Spec:
    adapter: str | None
    question: str
    image_seed: int | None = None

    def payload(self, max_new_tokens: int = MAX_NEW, stream: bool = False) -> dict:
        body = {
            "text": chat_text(self.question, with_image=self.image_seed is not None),
            "lora_path": self.adapter,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
            "return_logprob": True,
            "top_logprobs_num": 2,
            "stream": stream,
        }
        if self.image_seed is not None:
            body["image_data"] = "data:image/png;base64," + png_base64(make_image(seed=self.image_seed))
        return body


@dataclass
class Answer:
    tokens: list[int]
    logprobs: list[float]
    margins: list[float]


def parse(body: dict) -> Answer:
    meta = body["meta_info"]
    top = meta["output_top_logprobs"]
    return Answer(
        tokens=[t[1] for t in meta["output_token_logprobs"]],
        logprobs=[t[0] for t in meta["output_token_logprobs"]],
        margins=[step[0][0] - step[1][0] for step in top],
    )


def assert_same_up_to_near_ties(got: Answer, solo: Answer, what: str) -> None:
    assert len(got.tokens) == len(solo.tokens), what
    for step, (a, b) in enumerate(zip(got.tokens, solo.tokens, strict=True)):
        if a != b:
            assert solo.margins[step] <= NEAR_TIE, f"{what}: step {step} chose {a}, solo {b} (margin {solo.margins[step]:.2e})"
            return  # the continuations differ from here on


def flush_cache(server, admin: dict = ADMIN, timeout_s: float = 30) -> None:
    """Empty the radix cache (once the server is idle): solo runs then compute the whole prompt,
    so two of them are comparable bit for bit. ``admin``: the headers the server's admin
    routes take."""
    response = httpx.post(server.url + f"/flush_cache?timeout={timeout_s}", headers=admin, timeout=timeout_s + 30)
    assert response.status_code == 200, response.text


def solo_answers(server, specs: list[Spec], max_new_tokens: int = MAX_NEW, admin: dict = ADMIN) -> dict[Spec, Answer]:
    flush_cache(server, admin)
    answers = {}
    for spec in specs:
        response = httpx.post(server.url + "/generate", json=spec.payload(max_new_tokens), headers=USER, timeout=120)
        assert response.status_code == 200, response.text
        answers[spec] = parse(response.json())
    return answers
