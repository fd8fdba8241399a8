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


def _picture(colour=(10, 20, 30)):
    from PIL import Image

    return Image.new("RGB", (8, 8), colour)


def test_gradio_rewrites_a_cached_picture_in_place(tmp_path):
    # the reason whole_files exists: the same picture returned twice is written again into the file an earlier
    # response may still be reading (same inode, written anew); should Gradio stop, this fails and whole_files can go
    import time

    from denoiser.app import cache_sweep

    first = cache_sweep._gradio_save_pil(_picture(), str(tmp_path))
    before = os.stat(first)
    time.sleep(0.02)
    assert cache_sweep._gradio_save_pil(_picture(), str(tmp_path)) == first
    after = os.stat(first)
    assert after.st_ino == before.st_ino and after.st_mtime_ns != before.st_mtime_ns


def test_whole_files_writes_a_picture_once_and_a_new_one_by_rename(tmp_path):
    import time

    from gradio import processing_utils

    from denoiser.app.cache_sweep import whole_files

    whole_files()
    save = processing_utils.save_pil_to_cache  # what Gradio's components call from now on
    first = save(_picture(), str(tmp_path), format="png")
    with open(first, "rb") as reader:  # a response that has begun serving it
        before = os.stat(first)
        time.sleep(0.02)
        assert save(_picture(), str(tmp_path), format="png") == first  # the same picture: the same file, untouched
        assert os.stat(first).st_mtime_ns == before.st_mtime_ns and reader.read() == open(first, "rb").read()
    other = save(_picture((200, 0, 0)), str(tmp_path), format="png")
    assert other != first and os.path.getsize(other) > 0
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]  # written beside, then renamed into place
    image = gr.Image(format="png").postprocess(_picture((0, 90, 0)))  # a component's own call reaches it
    assert os.path.isfile(image.path)
