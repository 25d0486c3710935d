"""Task heads: one forward pass answers with a label and top-k probabilities equal to
HF + peft's last-token hidden state through the same head; head requests share batches
with ordinary generation; bad heads and bad head requests get a clear 400."""

import json
import shutil

import httpx
import pytest
import torch

from sglang_vlora.adapters import load_head, save_heads
from sglang_vlora.heads.task_head import HeadSpec, TaskHead
from tests.server.reference import HFReference, chat_text, make_image, png_base64

HIDDEN = 128
LABELS = ("cat", "dog", "car", "tree", "person", "bus")
PROB_TOL = 1e-4


def make_head(task: str, hidden: int = HIDDEN, seed: int = 0) -> TaskHead:
    torch.manual_seed(seed)
    head = TaskHead(HeadSpec(task=task, labels=LABELS, prompt="What is in the image?"), hidden)
    with torch.no_grad():
        head.linear.weight.mul_(20.0)  # spread the probabilities so the label is clear
    return head


@pytest.fixture(scope="module")
def head_adapter(server, tmp_path_factory):
    path = tmp_path_factory.mktemp("heads") / "c32_head"
    shutil.copytree(server.adapters["c32"], path)
    save_heads([make_head("object-class")], path)
    response = httpx.post(
        server.url + "/load_lora_adapter", json={"lora_name": "c32_head", "lora_path": str(path)}, timeout=120
    )
    assert response.status_code == 200, response.text
    return path


def head_request(text, adapter, image=None, head=True, max_new_tokens=8):
    body = {
        "text": text,
        "lora_path": adapter,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "custom_params": {"vlora_head": head}},
    }
    if image is not None:
        body["image_data"] = "data:image/png;base64," + png_base64(image)
    return body


@torch.no_grad()
def hf_head_probs(server, head_dir, text, image) -> torch.Tensor:
    ref = HFReference(server.model_dir, {"c32": head_dir})
    captured = {}
    norm = ref.model.base_model.model.model.language_model.norm
    handle = norm.register_forward_hook(lambda m, i, o: captured.__setitem__("h", o))
    try:
        ref.model.set_adapter("c32")
        ref.model(**ref.inputs(text, image))
    finally:
        handle.remove()
    head = load_head(head_dir, HIDDEN)
    return torch.softmax(head(captured["h"][0, -1].unsqueeze(0)), dim=-1)[0]


@pytest.mark.parametrize("with_image", [False, True], ids=["text", "image"])
def test_head_answers_in_one_forward_like_hf(server, head_adapter, with_image):
    image = make_image(seed=5) if with_image else None
    text = chat_text("What is in the image?", with_image=with_image)
    body = httpx.post(server.url + "/generate", json=head_request(text, "c32_head", image), timeout=120).json()
    meta = body["meta_info"]
    assert meta["completion_tokens"] == 1  # finished after prefill
    answer = meta["vlora_head"][0]
    expected = hf_head_probs(server, head_adapter, text, image)
    assert answer["task"] == "object-class"
    assert answer["label"] == LABELS[int(expected.argmax())]
    for entry in answer["top_k"]:
        assert abs(entry["prob"] - float(expected[LABELS.index(entry["label"])])) <= PROB_TOL
    assert [e["label"] for e in answer["top_k"]] == [LABELS[i] for i in expected.argsort(descending=True)[:5]]


def test_head_requests_share_a_batch_with_generation(server, head_adapter):
    text = chat_text("What is in the image?", with_image=False)
    alone_head = httpx.post(server.url + "/generate", json=head_request(text, "c32_head"), timeout=120).json()
    alone_gen = httpx.post(
        server.url + "/generate",
        json={"text": text, "lora_path": "a8", "sampling_params": {"max_new_tokens": 6, "temperature": 0}},
        timeout=120,
    ).json()
    batch = httpx.post(
        server.url + "/generate",
        json={
            "text": [text, text],
            "lora_path": ["c32_head", "a8"],
            "sampling_params": [
                {"max_new_tokens": 8, "temperature": 0, "custom_params": {"vlora_head": True}},
                {"max_new_tokens": 6, "temperature": 0},
            ],
        },
        timeout=120,
    ).json()
    assert batch[0]["meta_info"]["vlora_head"][0]["label"] == alone_head["meta_info"]["vlora_head"][0]["label"]
    assert batch[1]["text"] == alone_gen["text"]
    assert batch[1]["meta_info"]["completion_tokens"] == 6
    # Only head requests carry the field (SGLang pads the batch's other requests with nulls).
    assert "vlora_head" not in batch[1]["meta_info"]
    assert "vlora_head" not in alone_gen["meta_info"]


@pytest.mark.parametrize(
    "adapter, head, reason",
    [
        ("a8", True, "has no task head"),
        (None, True, "needs an adapter"),
        ("c32_head", "no-such-task", "no head for task"),
        ("c32_head", 3, "must be true or a task name"),
        ("c32_head", {"vlora_head": True}, "must be true or a task name"),
    ],
)
def test_bad_head_requests_are_400(server, head_adapter, adapter, head, reason):
    response = httpx.post(
        server.url + "/generate", json=head_request(chat_text("x", False), adapter, head=head), timeout=60
    )
    assert response.status_code == 400, response.text
    assert reason in response.text


def test_head_of_the_wrong_width_fails_the_load(server, tmp_path):
    path = tmp_path / "bad_head"
    shutil.copytree(server.adapters["a8"], path)
    save_heads([make_head("object-class", hidden=64)], path)
    response = httpx.post(
        server.url + "/load_lora_adapter", json={"lora_name": "bad_head", "lora_path": str(path)}, timeout=60
    )
    assert response.status_code == 400
    assert "hidden size 64" in response.text
    ok = httpx.post(server.url + "/generate", json=head_request(chat_text("x", False), "c32_head"), timeout=60)
    assert ok.status_code == 200


def test_openai_chat_gets_the_label_as_text_and_the_structured_answer(server, head_adapter):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    image_url = "data:image/png;base64," + png_base64(make_image(seed=5))
    reply = client.chat.completions.create(
        model=f"{server.model_dir}:c32_head",
        messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image_url}},
            {"type": "text", "text": "What is in the image?"},
        ]}],
        extra_body={"custom_params": {"vlora_head": True}, "return_meta_info": True},
    )
    choice = reply.choices[0]
    answer = choice.meta_info["vlora_head"][0]
    assert choice.message.content == answer["label"] in LABELS
    assert reply.usage.completion_tokens == 1


def test_a_streamed_generate_carries_the_head_answer_in_meta_info(server, head_adapter):
    body = {**head_request(chat_text("What is in the image?", False), "c32_head"), "stream": True}
    response = httpx.post(server.url + "/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    events = [json.loads(line[len("data: "):]) for line in response.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    answer = events[-1]["meta_info"]["vlora_head"][0]
    assert answer["label"] in LABELS and answer["task"] == "object-class"


def test_openai_requests_that_would_lose_the_head_answer_are_400(server, head_adapter):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    model = f"{server.model_dir}:c32_head"
    head = {"custom_params": {"vlora_head": True}}
    with pytest.raises(openai.BadRequestError, match="streamed chat completion cannot carry a head's answer"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], extra_body=head,
                                       stream=True)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError, match="text completion cannot carry a head's answer"):
            client.completions.create(model=model, prompt="hi", max_tokens=2, extra_body=head, stream=stream)
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], extra_body=head)
    assert reply.choices[0].message.content in LABELS
    plain = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                           stream=True)
    assert [chunk for chunk in plain]
