"""SGLang's frontend language against the plugin's server: the README's multi-round
VQA on one image."""

import sglang as sgl

from tests.server.reference import make_image


@sgl.function
def multi_round_vqa(s, image_path, questions):
    s += sgl.user(sgl.image(image_path) + questions[0])
    s += sgl.assistant(sgl.gen("answer_0", max_tokens=4, temperature=0))
    for i, question in enumerate(questions[1:], start=1):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen(f"answer_{i}", max_tokens=4, temperature=0))


def test_multi_round_vqa_with_the_frontend(server, tmp_path):
    image_path = tmp_path / "frame.png"
    make_image(seed=7).save(image_path)
    backend = sgl.RuntimeEndpoint(server.url)
    questions = ["What is in the image?", "How many objects are there?", "Which color dominates?"]
    state = multi_round_vqa.run(image_path=str(image_path), questions=questions, backend=backend)
    answers = [state[f"answer_{i}"] for i in range(3)]
    assert all(isinstance(a, str) for a in answers)
    # Rounds after the first reuse the KV of the conversation so far, image included.
    first = state.get_meta_info("answer_0")
    last = state.get_meta_info("answer_2")
    assert last["cached_tokens"] >= first["prompt_tokens"]
