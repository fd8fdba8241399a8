"""Gradio's cache sweep (`gr.Blocks(delete_cache=...)`), kept alive while handlers add files.

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
tests/test_app_cache_sweep.py::test_gradio_sweep_alone_fails_when_a_file_is_added_midway fails, and this module
and its one call in layout.py can be deleted. The other tests there fail if Gradio renames or stops sharing
those sets.
"""

from __future__ import annotations

import gradio as gr

__all__ = ["SnapshotSet", "sweep_safe"]


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
