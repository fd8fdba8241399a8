"""Gradio's cache, kept sound while handlers add files: its sweep (`gr.Blocks(delete_cache=...)`) survives files
added midway, and a picture written again is never served half-written.

Every file Gradio writes for a component (a preview streamed at each step, a gallery's PNGs, an upload) is
recorded in a set: the component's `temp_files`, or the app's `upload_file_set`. The sweep walks those sets
in a worker thread, checking each file's age, while handlers keep adding to them. A file added mid-walk makes
Python raise "Set changed size during iteration", which ends Gradio's scheduled sweep for the life of the
server: its cache then only grows. On a busy server that is a matter of hours (a walk over a few thousand files
lasts milliseconds; a run adds a preview several times a second).

`sweep_safe(app)` swaps each of those sets for one whose iteration walks a copy taken in one step, so the
sweep sees the files present when it began and a file added meanwhile waits for the next sweep. Nothing else
about the sets changes: they are still sets, shared by the same owners.

This is a patch to Gradio's internals, written against gradio 6.31.0: it relies on the sweep
(`gradio.route_utils.delete_files_created_by_app`) walking `Blocks.temp_file_sets` (the uploads'
`upload_file_set` and each component's `temp_files`) directly, although its comment says it walks a copy. What
would let it go: Gradio iterating a copy (`for file in list(temp_set)`); then
tests/app/test_cache_sweep.py::test_gradio_sweep_alone_fails_when_a_file_is_added_midway fails, and this module
and its one call in layout.py can be deleted. The other tests there fail if Gradio renames or stops sharing
those sets.

Second, `whole_files()`: Gradio keeps a returned picture at a path named by its content's hash, and writes it
there again each time the same picture is returned (a preview or a map shown twice), truncating the file that an
earlier response may still be reading; the server then logs "Too much/little data for declared Content-Length".
Its own copies of files (`save_file_to_cache`) skip a file already there and write through a rename; this gives
its pictures the same: the same content is not written again, a new one is written beside and renamed into place
(denoiser.atomic). Written against gradio 6.31.0 (`gradio.processing_utils.save_pil_to_cache`, looked up by the
components through the module); tests/app/test_cache_sweep.py::test_gradio_rewrites_a_cached_picture_in_place
fails the day Gradio stops rewriting, and then `whole_files` can go.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr
from gradio import processing_utils

from denoiser.atomic import atomic_path

__all__ = ["SnapshotSet", "sweep_safe", "whole_files"]

_gradio_save_pil = processing_utils.save_pil_to_cache  # Gradio's own, kept for its guard test


class SnapshotSet(set):
    """A set whose iteration walks a copy: adding to it during a walk is allowed (the walk does not see it)."""

    def __iter__(self):
        return iter(set.copy(self))  # one C call under the GIL: no other thread adds midway


def sweep_safe(app: gr.Blocks) -> gr.Blocks:
    """Swap `app`'s file sets (each component's and the uploads') for SnapshotSets, in every place that holds
    them; call once the page is built, before launch."""
    swapped: dict[int, SnapshotSet] = {}

    def safe(files: set) -> SnapshotSet:
        if id(files) not in swapped:
            swapped[id(files)] = files if isinstance(files, SnapshotSet) else SnapshotSet(files)
        return swapped[id(files)]

    for block in app.blocks.values():
        if isinstance(getattr(block, "temp_files", None), set):
            block.temp_files = safe(block.temp_files)
    app.upload_file_set = safe(app.upload_file_set)
    app.temp_file_sets = [safe(files) for files in app.temp_file_sets]
    return app


def _save_pil_whole(img, cache_dir: str, name: str = "image", format: str = "webp") -> str:
    """gradio.processing_utils.save_pil_to_cache, writing a path only once and only whole."""
    data = processing_utils.encode_pil_to_bytes(img, format)
    path = (Path(cache_dir) / processing_utils.hash_bytes(data) / f"{name}.{format}").resolve()
    if not (path.is_file() and path.stat().st_size == len(data)):  # named by its content: the same bytes are there
        path.parent.mkdir(exist_ok=True, parents=True)
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
    return str(path)


def whole_files() -> None:
    """Route Gradio's saving of returned pictures through _save_pil_whole (once per process; idempotent)."""
    processing_utils.save_pil_to_cache = _save_pil_whole
