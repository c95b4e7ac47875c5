"""The headless runner's core stand-ins save as ComfyUI's Save Image does (counters, prefix confined
to the output folder) and all or nothing; a UI-format workflow gets a clear error."""
from __future__ import annotations

import json

import pytest
import torch

from helpers import ROOT


@pytest.fixture
def headless(pack, tmp_path):
    from vaekit.nodes import headless
    headless._Dirs.output = tmp_path
    return headless


def test_save_image_batch_is_all_or_nothing(headless, tmp_path, monkeypatch):
    from vaekit.vae.files.imageio import write_image
    calls = []

    def third_fails(path, image):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        write_image(path, image)
    monkeypatch.setattr(headless, "write_image", third_fails)
    with pytest.raises(OSError):
        headless.SaveImage().save(torch.rand(4, 8, 8, 3), "batch")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    ui = headless.SaveImage().save(torch.rand(2, 8, 8, 3), "batch")
    assert [p.rsplit("/", 1)[-1] for p in ui["ui"]["images"]] == ["batch_00001_.png", "batch_00002_.png"]


@pytest.mark.parametrize("prefix", ["../x", "/etc/x", "a/../../x"])
def test_save_prefix_outside_the_output_folder_is_refused(headless, tmp_path, prefix):
    with pytest.raises(ValueError, match="outside the output folder"):
        headless.SaveLatent().save({"samples": torch.zeros(1, 4, 2, 2)}, prefix)
    assert list(tmp_path.iterdir()) == []


def test_ui_format_and_non_workflows(headless):
    ui = json.loads((ROOT / "workflows" / "image_tiled_roundtrip.json").read_text())
    with pytest.raises(headless.WorkflowError, match="is a UI-format workflow"):
        headless.run_prompt(ui)
    with pytest.raises(headless.WorkflowError, match="not an API-format workflow"):
        headless.run_prompt([1, 2])
    with pytest.raises(headless.WorkflowError) as e:
        headless.run_prompt({"1": "SaveImage", "2": {"class_type": "Nope", "inputs": {}}})
    assert len(e.value.problems) == 3 and "#1: not a node" in e.value.problems[1]
