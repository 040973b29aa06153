"""`uploaded_path`: the named API's file inputs (an input image, a mask, reference images), handed to the handlers as
the uploaded file's path, unopened (`engine.images` is the first to read it).

It is Gradio's `gr.File(type="filepath")`, less one leak: Gradio 6.31's `File` opens a `NamedTemporaryFile` in its
cache folder for each file it passes on as a path, then neither writes, deletes nor tracks it, so `delete_cache`
(TEMP_FILES_MAX_AGE_S) never reaches it and every upload left an empty file in GRADIO_TEMP_DIR for good. The
upload itself stays where Gradio put it, tracked and cleaned with the rest. The one method is replaced on the
instance, not in a subclass: a `gr.File` subclass is a new component to Gradio, which writes a `.pyi` stub beside
the module that defines it when it is imported.
"""

from __future__ import annotations

from typing import Any

import gradio as gr
from gradio.data_classes import FileData
from gradio.utils import NamedString

__all__ = ["uploaded_path"]


def uploaded_path(**kwargs: Any) -> gr.File:
    """`gr.File(type="filepath", **kwargs)` whose files reach the handler as the uploads' own paths, with no stray
    empty file beside them."""
    component = gr.File(type="filepath", **kwargs)
    component._process_single_file = _path  # type: ignore[method-assign, assignment]
    return component


def _path(payload: FileData) -> NamedString:
    """What `File._process_single_file` passes on for `type="filepath"` (no `file_types`: none of ours has one)."""
    return NamedString(payload.path)
