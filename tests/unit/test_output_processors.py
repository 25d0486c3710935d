"""Output processors and prompt templates of the five vision tasks."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_vlora import prompts
from sglang_vlora.heads.output_processors import Box, process


def test_referring_expression_maps_grid_to_pixels():
    r = process("referring_expression", "<ref>handshake</ref><box>(536,509),(588,602)</box>", image_size=(1000, 500))
    assert not r.malformed
    assert r.boxes == [Box("handshake", 536.0, 254.5, 588.0, 301.0)]


def test_detection_keeps_every_box_with_its_label():
    text = "<ref>airplane</ref><box>(767,0),(910,83)</box><box>(601,0),(748,76)</box> <ref>car</ref><box>(0,500),(100,1000)</box>"
    r = process("object_detection", text, image_size=(200, 100))
    assert [b.label for b in r.boxes] == ["airplane", "airplane", "car"]
    assert r.boxes[2] == Box("car", 0.0, 50.0, 20.0, 100.0)
    assert not r.malformed


@pytest.mark.parametrize(
    "text, problem",
    [
        ("<ref>dog</ref><box>(10,20),(30)</box>", "unreadable box"),
        ("<ref>dog</ref><box>(10,20),(1300,40)</box>", "grid"),
        ("<ref>dog</ref><box>(50,60),(10,20)</box>", "swapped"),
        ("<ref>dog</ref><box>(10,20),(30,40)", "unterminated"),
        ("there is a dog", "no box"),
    ],
)
def test_malformed_boxes_return_what_parses_and_a_flag(text, problem):
    r = process("object_detection", text, image_size=(100, 100))
    assert r.malformed
    assert any(problem in p for p in r.problems), r.problems


def test_clamped_and_reordered_boxes_are_still_returned():
    r = process("object_detection", "<ref>dog</ref><box>(50,60),(10,20)</box>", image_size=(100, 100))
    assert r.boxes == [Box("dog", 1.0, 2.0, 5.0, 6.0)]


def test_text_tasks_strip_special_tokens():
    r = process("vqa", " There are three cars.<|im_end|>")
    assert r.label == "There are three cars." and not r.malformed
    assert process("captioning", "<|im_end|>").malformed


def test_video_understanding_picks_the_named_action():
    labels = ["Boxing Punching Bag", "Walking", "Running"]
    r = process("video_understanding", "the person is boxing punching bag in a gym", labels=labels)
    assert r.label == "Boxing Punching Bag" and not r.malformed
    r = process("video_understanding", "dancing", labels=labels)
    assert r.malformed and r.label == "dancing"


def test_unknown_task_and_missing_size_are_flagged():
    assert process("segmentation", "x").malformed
    assert process("object_detection", "<box>(1,1),(2,2)</box>").malformed


@given(st.text(max_size=200), st.sampled_from(prompts.TASKS))
def test_never_raises(text, task):
    r = process(task, text, image_size=(64, 48), labels=["walking"])
    assert r.task == task and r.text == text


@given(st.lists(st.tuples(*[st.integers(0, 1000)] * 4), min_size=1, max_size=4))
def test_well_formed_boxes_round_trip(boxes):
    text = "<ref>obj</ref>" + "".join(f"<box>({min(a,c)},{min(b,d)}),({max(a,c)},{max(b,d)})</box>" for a, b, c, d in boxes)
    r = process("object_detection", text, image_size=(1000, 1000))
    assert not r.malformed
    assert len(r.boxes) == len(boxes)


def test_every_task_has_a_template():
    assert set(prompts.templates()) == set(prompts.TASKS)
    messages = prompts.build_messages("video_understanding", [f"data:image/png;base64,{i}" for i in range(6)])
    assert len(messages[0]["content"]) == 7
    assert prompts.instruction("object_detection", category="airplane").endswith("are airplane.")


def test_template_errors_are_clear():
    with pytest.raises(ValueError, match="needs"):
        prompts.instruction("vqa")
    with pytest.raises(ValueError, match="6 image"):
        prompts.build_messages("video_understanding", ["a"])
    with pytest.raises(ValueError, match="unknown task"):
        prompts.instruction("ocr")
