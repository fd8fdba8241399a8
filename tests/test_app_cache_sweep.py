"""denoiser/app/cache_sweep.py: Gradio's cache sweep survives a file added while it walks the sets."""

from __future__ import annotations

import os

import pytest

gr = pytest.importorskip("gradio")
from gradio.route_utils import delete_files_created_by_app  # noqa: E402

from denoiser.app.cache_sweep import SnapshotSet, sweep_safe  # noqa: E402


def _app_with_files(tmp_path, n: int = 5):
    with gr.Blocks() as app:
        image = gr.Image()
    files = [tmp_path / f"old-{i}.png" for i in range(n)]
    for f in files:
        f.write_bytes(b"png")
        image.temp_files.add(str(f))
    return app, image, files


def _sweep_while_a_handler_adds(monkeypatch, app, files_of, new_file):
    """Gradio's sweep (every file, any age), with a handler adding `new_file` right after its first removal."""
    remove = os.remove

    def remove_then_add(path):
        remove(path)
        if not new_file.exists():
            new_file.write_bytes(b"png")
            files_of.temp_files.add(str(new_file))

    monkeypatch.setattr(os, "remove", remove_then_add)
    delete_files_created_by_app(app, None)
    monkeypatch.setattr(os, "remove", remove)


def test_gradio_sweep_alone_fails_when_a_file_is_added_midway(tmp_path, monkeypatch):
    # the reason sweep_safe exists; should Gradio fix it, this fails and the module can go
    app, image, _ = _app_with_files(tmp_path)
    with pytest.raises(RuntimeError, match="changed size during iteration"):
        _sweep_while_a_handler_adds(monkeypatch, app, image, tmp_path / "new.png")


def test_the_swept_sets_finish_and_keep_the_file_added_midway(tmp_path, monkeypatch):
    app, image, old = _app_with_files(tmp_path)
    assert sweep_safe(app) is app
    new = tmp_path / "new.png"
    _sweep_while_a_handler_adds(monkeypatch, app, image, new)
    assert not any(f.exists() for f in old)  # every file there when the sweep began is gone ...
    assert new.exists() and image.temp_files == {str(new)}  # ... the one added meanwhile waits for the next
    delete_files_created_by_app(app, None)
    assert not new.exists() and image.temp_files == set()


def test_every_holder_shares_the_swapped_set(tmp_path):
    app, image, _ = _app_with_files(tmp_path)
    sweep_safe(app)
    sweep_safe(app)  # twice: nothing changes
    assert all(type(s) is SnapshotSet for s in app.temp_file_sets)
    assert any(s is image.temp_files for s in app.temp_file_sets)  # a file the image adds is one the sweep sees
    assert any(s is app.upload_file_set for s in app.temp_file_sets)
    assert len({id(s) for s in app.temp_file_sets}) == len(app.temp_file_sets)


def test_the_app_is_built_sweep_safe(tmp_path):
    from denoiser.app.engine import Engine
    from denoiser.app.layout import build_app

    app = build_app(Engine(tmp_path))  # no models: the page still builds
    assert all(type(s) is SnapshotSet for s in app.temp_file_sets)
    components = [b for b in app.blocks.values() if isinstance(b, gr.components.Component)]
    assert len(components) > 50
    for block in components:  # the files a component writes are in a set the sweep walks
        assert any(s is block.temp_files for s in app.temp_file_sets), block
