"""Mode tests use tiny shapes and one intra-op thread: thread fan-out on such shapes
costs more than it saves, and on a loaded machine it made the 10,000-switch test
200x slower (93 s against 0.4 s). The Triton fold kernel runs in Triton's
interpreter on CPU."""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
