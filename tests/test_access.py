"""A shared server (``VIZAPP_SHARED=1``) trusts no visitor, nor any link, with its file system
(vizapp.access): paths load only inside ``VIZAPP_MODEL_ROOTS``, hub weights only with
``VIZAPP_ALLOW_HUB=1``, and a refusal reads the same whether the path exists or not."""

from __future__ import annotations

import os

import pytest
from streamlit.testing.v1 import AppTest

from model_folders import model_folder
from tests.test_app import APP, TIMEOUT
from vizapp.access import HUB_REFUSED, PATH_REFUSED, SourceRefusedError, check_source


@pytest.fixture
def shared(monkeypatch, tmp_path):
    """A shared server whose operator allows ``tmp_path / "allowed"``; returns that folder."""
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    monkeypatch.setenv("VIZAPP_SHARED", "1")
    monkeypatch.setenv("VIZAPP_MODEL_ROOTS", str(allowed))
    monkeypatch.delenv("VIZAPP_ALLOW_HUB", raising=False)
    monkeypatch.delenv("VIZAPP_DEFAULT_MODEL", raising=False)
    return allowed


def refusal(source: str, **kwargs) -> str | None:
    try:
        check_source(source, **kwargs)
    except SourceRefusedError as exc:
        return str(exc)
    return None


def test_a_shared_server_refuses_paths_outside_its_roots_in_the_same_words(shared, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    (shared / "model").mkdir()
    escape = shared / ".." / "outside"
    link = shared / "link"
    link.symlink_to(outside)
    for source in (str(outside), str(tmp_path / "missing"), "/root/.ssh", "~", "../x", str(escape), str(link), "w.pth"):
        assert refusal(source) == PATH_REFUSED, source  # existing or not: one message
    assert refusal(str(shared / "model")) is None and refusal(str(shared / "missing")) is None
    assert refusal(str(shared)) is None


def test_a_shared_server_refuses_hub_downloads_unless_allowed(shared, monkeypatch):
    for source in ("vit_base_patch16_224", "hf-hub:timm/vit_base_patch16_224", "hf:facebook/vit-mae-base"):
        assert refusal(source) == HUB_REFUSED, source
    for source in ("demo", "demo_swin", "demo_clip", "demo_mae"):
        assert refusal(source) is None, source
    assert refusal("vit_base_patch16_224", pretrained=False) is None  # random weights: nothing downloaded
    assert refusal("torchvision:swin_t", pretrained=False) is None
    monkeypatch.setenv("VIZAPP_ALLOW_HUB", "1")
    assert refusal("hf-hub:timm/vit_base_patch16_224") is None and refusal("vit_base_patch16_224") is None
    assert refusal("/etc") == PATH_REFUSED  # the hub switch opens no path


def test_ones_own_machine_refuses_nothing_and_the_operators_default_always_loads(shared, monkeypatch, tmp_path):
    monkeypatch.setenv("VIZAPP_DEFAULT_MODEL", str(tmp_path / "operator"))
    assert refusal(str(tmp_path / "operator")) is None
    monkeypatch.setenv("VIZAPP_SHARED", "0")
    assert refusal("/root/.ssh") is None and refusal("hf-hub:timm/vit_base_patch16_224") is None


def test_every_loader_of_the_app_asks_first(shared, tmp_path):
    """The model (sidebar, link, second-model boxes), CNN, MAE, CLIP and SAE loaders refuse a path
    outside the roots before reading it."""
    from vizapp import resources, sae_resources
    from vizapp.refs import ModelRef
    from vizapp.views.mae import compute as mae_compute
    from vizapp.views.text_prompts import compute as text_compute

    outside = str(tmp_path / "nowhere")
    loaders = {
        "model": lambda: resources.get_model(ModelRef(outside)),
        "cnn": lambda: resources.get_cnn(outside),
        "mae": lambda: mae_compute.get_mae(outside),
        "clip": lambda: text_compute.get_clip(outside),
        "sae": lambda: sae_resources.get_sae(outside),
    }
    for _name, load in loaders.items():
        with pytest.raises(SourceRefusedError, match="shared server"):
            load()


def test_a_link_to_a_folder_outside_the_roots_loads_nothing_and_keeps_the_model(shared):
    """A link naming a real model folder outside the roots, and one naming no folder at all: the same
    message (after the name the visitor gave), the default model stays, and the URL does not carry the path; inside the roots it opens."""
    folder = model_folder("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=3)
    shown = []
    for source in (folder, folder + "_missing"):
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.query_params["model"] = source
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert at.session_state["current"].model.source == "demo"
        shown.append([e.value.split("**: ", 1)[-1] for e in at.error if "shared server" in e.value])  # after the name
        assert source not in str(dict(at.query_params))
    assert shown[0] == shown[1] and len(shown[0]) == 1, shown
    os.environ["VIZAPP_MODEL_ROOTS"] = os.path.dirname(os.path.dirname(folder))  # monkeypatch restores it
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["model"] = folder
    at.run()
    assert at.session_state["current"].model.source == folder
