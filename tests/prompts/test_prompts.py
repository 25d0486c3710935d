"""The task templates are files in prompts/: the package reads them (or a user's folder named by
SGLANG_VLORA_PROMPTS_DIR), and a missing or malformed template is an error naming the file."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from sglang_vlora import prompts

REPO_PROMPTS = Path(__file__).resolve().parents[2] / "prompts"


@pytest.fixture
def own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped templates, selected through the environment variable."""
    folder = tmp_path / "my_prompts"
    shutil.copytree(prompts.templates_dir(), folder)
    monkeypatch.setenv(prompts.PROMPTS_DIR_ENV, str(folder))
    return folder


def test_the_package_reads_the_top_level_folder() -> None:
    assert prompts.templates_dir().resolve() == REPO_PROMPTS.resolve()
    for task in prompts.TASKS:
        on_disk = tomllib.loads((REPO_PROMPTS / f"{task}.toml").read_text())
        assert prompts.templates()[task] == on_disk
    assert prompts.templates()["video_understanding"]["images"] == 6


def test_a_users_folder_replaces_the_shipped_templates(own_folder: Path) -> None:
    path = own_folder / "vqa.toml"
    path.write_text(path.read_text().replace('"{question}"', '"Answer briefly: {question}"'))
    messages = prompts.build_messages("vqa", ["data:image/png;base64,x"], question="What is it?")
    assert messages[0]["content"][-1] == {"type": "text", "text": "Answer briefly: What is it?"}
    assert prompts.template_fields("vqa") == ["question"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t + "\nimages = 2\n", "not valid TOML"),
        (lambda t: t.replace("images = 1", ""), r"missing \['images'\]"),
        (lambda t: t + 'colour = "red"\n', r"unknown \['colour'\]"),
        (lambda t: t.replace("images = 1", 'images = "one"'), "images must be a int"),
        (lambda t: t.replace("images = 1", "images = 0"), "at least 1"),
        (lambda t: t.replace('"visual_retrieval"', '"robotics"'), "application must be one of"),
        (lambda t: t.replace('"{question}"', '"{question"'), "does not parse"),
        (lambda t: t.replace('"{question}"', '"{} {0}"'), "must be names"),
        (lambda t: t.replace('"{question}"', '"  "'), "instruction is empty"),
    ],
)
def test_a_malformed_template_names_its_file(own_folder: Path, edit, message: str) -> None:
    path = own_folder / "vqa.toml"
    path.write_text(edit(path.read_text()))
    with pytest.raises(prompts.PromptTemplateError, match=message) as error:
        prompts.templates()
    assert "vqa.toml" in str(error.value)


def test_a_missing_or_unknown_template_file_is_an_error(own_folder: Path, monkeypatch) -> None:
    (own_folder / "captioning.toml").unlink()
    with pytest.raises(prompts.PromptTemplateError, match=r"missing template\(s\) \['captioning.toml'\]"):
        prompts.build_messages("vqa", ["x"], question="q")
    shutil.copy(own_folder / "vqa.toml", own_folder / "captioning.toml")
    shutil.copy(own_folder / "vqa.toml", own_folder / "caption.toml")
    with pytest.raises(prompts.PromptTemplateError, match="caption.toml'] name no task"):
        prompts.templates()
    monkeypatch.setenv(prompts.PROMPTS_DIR_ENV, str(own_folder / "nowhere"))
    with pytest.raises(prompts.PromptTemplateError, match="does not exist"):
        prompts.templates()
