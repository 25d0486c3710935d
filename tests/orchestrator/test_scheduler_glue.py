"""What the scheduler glue reads from SGLang's objects, on stand-ins with the same fields:
the work of a batch (for the cost fit) and the capacity the max batch is capped at."""

from types import SimpleNamespace

import pytest

from sglang_vlora.orchestrator.runtime import _capacity, _work


def batch(extend: bool, reqs: int, extend_tokens: int | None = None, decoding: int = 0):
    return SimpleNamespace(
        forward_mode=SimpleNamespace(is_extend=lambda: extend),
        batch_size=lambda: reqs,
        extend_num_tokens=extend_tokens,
        decoding_reqs=[object()] * decoding or None,
    )


@pytest.mark.parametrize(
    ("b", "work"),
    [
        (batch(False, 12), (0, 12)),  # a decode step: 12 requests gain a token
        (batch(True, 3, extend_tokens=700), (700, 0)),  # a prefill of 700 new tokens
        (batch(True, 5, extend_tokens=164, decoding=4), (160, 4)),  # mixed: 4 decode tokens ride along
        (batch(True, 1, extend_tokens=None), (0, 0)),  # nothing to count (SGLang left it unset)
    ],
)
def test_the_work_of_a_batch(b, work):
    assert _work(b) == work


def scheduler(max_running: int, graph_bs: int | None):
    runner = SimpleNamespace(decode_cuda_graph_runner=None if graph_bs is None else SimpleNamespace(max_bs=graph_bs))
    return SimpleNamespace(max_running_requests=max_running, tp_worker=SimpleNamespace(model_runner=runner))


def test_capacity_is_max_running_requests_or_the_largest_decode_graph():
    assert _capacity(scheduler(4096, None)) == (4096, "max running requests")
    assert _capacity(scheduler(4096, 256)) == (256, "largest decode CUDA graph")
    assert _capacity(scheduler(48, 256)) == (48, "max running requests")
