"""The browser's image inputs, each refusing a file over MAX_INPUT_PIXELS by its header, with our message, before
Gradio's preprocess opens it with PIL: `CheckedImage` (a reference slot) and `CheckedEditor` (the input image and
its painted mask). PIL's own refusal of a decompression bomb names no limit of ours, and below it the editor's
preprocess would decode an image up to twice the cap first.

The check lives in the class, its limit among the constructor's arguments, because Gradio answers any update of a
component in an event (`gr.update`, a component, `gr.skip()` alike) with a fresh instance in the session, built
from those arguments (`Blocks.postprocess_data`: `block.__class__(**constructor_args)`), and the next event
preprocesses with that one: a check wrapped on the instance was gone after a base change or "Use as input". The
alternatives were weaker: `preprocess=False` on every event reading these inputs moves Gradio's editor handling
(its canvas's blobs, held on the session's instance) into our handlers; sending these inputs no update at all
holds only until someone sends one. Both are Gradio "templates" (`is_template`, as its own `gr.Sketchpad`): the
browser shows its own Image and ImageEditor, given the props of their arguments (`get_config`: Gradio reads them
off the constructor's signature, which here takes them as `**kwargs`).

Gradio's ComponentMeta writes a `.pyi` beside the module defining a component class, at import: a copy of the
whole module with the class's event stubs, which mypy reads instead of this file and which goes stale with any
edit (only the class is rewritten). `_no_stub` holds that write back while the two classes are defined.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gradio as gr
from gradio import component_meta
from gradio.blocks import Block

from engine.errors import InvalidRequestError
from engine.images import ACCEPTED, read_size
from serving.errors import user_errors

__all__ = ["CheckedEditor", "CheckedImage"]


@contextmanager
def _no_stub() -> Iterator[None]:
    """Gradio's `.pyi` writer (`component_meta.create_or_modify_pyi`) a no-op for the classes defined meanwhile."""
    write = component_meta.create_or_modify_pyi
    component_meta.create_or_modify_pyi = _nothing
    try:
        yield
    finally:
        component_meta.create_or_modify_pyi = write


def _nothing(component_class: type, class_name: str, events: list[Any]) -> None:
    """Where Gradio would write a `.pyi` for `component_class` (`_no_stub`)."""


with _no_stub():

    class CheckedImage(gr.Image):
        """`gr.Image` whose file is refused over `max_pixels` by its header, `what` ("Image 2") named; a file passed
        on as its path, unopened (the request decodes it: `serving.ui.references.references_of`)."""

        is_template = True

        def __init__(self, value: Any = None, *, max_pixels: int, what: str, **kwargs: Any) -> None:
            # Underscored: kept out of the browser's config (`Block.get_config` sends each argument's attribute).
            self._max_pixels, self._what = max_pixels, what
            super().__init__(value, **kwargs)

        def get_config(self, cls: type[Block] | None = None) -> dict[str, Any]:
            # The browser's props are those of `gr.Image`'s arguments (Gradio reads them off the signature).
            return super().get_config(cls or gr.Image)

        def preprocess(self, payload: Any) -> Any:
            if payload is None:
                return None
            with user_errors():
                read_size(_bytes_of(payload, self._what), what=self._what, max_pixels=self._max_pixels)
            if payload.path is not None and not (payload.url or "").startswith("data:"):
                # The path, as Gradio's preprocess answers it without an image_mode: without its PIL open (which
                # it leaves unclosed).
                return str(payload.path)
            return super().preprocess(payload)

    class CheckedEditor(gr.ImageEditor):
        """`gr.ImageEditor` whose files (the input image, each painted layer) are refused over `max_pixels` by their
        headers before its own preprocess opens and converts each with PIL."""

        is_template = True

        def __init__(self, value: Any = None, *, max_pixels: int, **kwargs: Any) -> None:
            self._max_pixels = max_pixels
            super().__init__(value, **kwargs)

        def get_config(self, cls: type[Block] | None = None) -> dict[str, Any]:
            return super().get_config(cls or gr.ImageEditor)

        def preprocess(self, payload: Any) -> Any:
            if payload is not None:
                # The browser's canvas sends its layers as blobs, held under the payload's id; an API caller, files.
                held = self.blob_storage.get(payload.id) if payload.id is not None else payload
                files = [("the input image", held.background), ("the input image", held.composite)] if held else []
                files += [("the painted mask", layer) for layer in (held.layers if held else None) or ()]
                with user_errors():
                    for what, file in files:
                        if file is not None:
                            read_size(_bytes_of(file, what), what=what, max_pixels=self._max_pixels)
            return super().preprocess(payload)


def _bytes_of(file: Any, what: str) -> bytes:
    """A blob's bytes, a data URL's (a paste may arrive so), or those of the file a `FileData` names."""
    if isinstance(file, bytes | bytearray | memoryview):
        return bytes(file)
    url = getattr(file, "url", None) or ""
    try:
        if url.startswith("data:"):
            return base64.b64decode(url.partition(",")[2], validate=True)
        return Path(file.path).read_bytes()
    except (binascii.Error, ValueError) as e:
        raise InvalidRequestError(f"{what} is not valid base64; accepted: {ACCEPTED}") from e
    except (OSError, TypeError) as e:
        raise InvalidRequestError(f"{what} could not be read ({e}); accepted: {ACCEPTED}") from e
