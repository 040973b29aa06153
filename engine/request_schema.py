"""How a request field is declared: once, on `GenerateRequest` (`engine.requests`), for every transport.

Each field of `GenerateRequest` carries a `RequestField` in its dataclass metadata: what it accepts (in the
words refusals use), what it means, its fixed bounds (limits that depend on the settings or the pool are the
engine's to apply), and its names at the edges: the inference API's parameter on `POST /` (Hugging Face's own
names as aliases) and the Gradio API's arguments. The HTTP body, the cluster's wire and the Gradio API are
derived from these (`serving.http.body`, `serving.cluster.wire`, `serving.ui.gradio_api`); a test holds each
equal to them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["FieldKind", "RequestField", "request_field"]

# How a JSON value of the field looks: text, a whole number, any number, the LoRA list, a sampler name, the
# scheduler's options, a switch, an image (`engine.images.InputImage` in the engine; base64 or a file at the
# edges), a list of images (a tuple of them in the engine; a list of base64 images or files at the edges), or a
# video (`engine.video_input`: an MP4, base64 or a file at the edges).
FieldKind = Literal["text", "integer", "number", "loras", "sampler", "options", "switch", "image", "images", "video"]


@dataclass(frozen=True)
class RequestField:
    """One request field's declaration (see the module docstring); `name` is filled from the dataclass field."""

    kind: FieldKind
    accepts: str
    description: str
    low: float | None = None
    high: float | None = None
    # Its parameter in the inference API's `parameters` (None: not one of them).
    http: str | None = None
    # The Gradio API's arguments for it (the LoRA list is two LoRAs and their scales; none: not offered there).
    gradio: tuple[str, ...] = ()
    # A video request's field (`ModelDefaults.video`): the image endpoints (/generate, /generate_images, /compare)
    # leave it out of their signatures, so theirs stay as they were; the video endpoint takes it.
    video: bool = False
    # The video endpoint's further arguments for it, after every declared field's (the LoRA list's low-noise
    # scales on a two-stage pool: `LoraSpec.scale_2`), so that its earlier positional arguments keep their places.
    gradio_video: tuple[str, ...] = ()
    # Every generation endpoint's arguments for it after all its others, `base` included (each LoRA's schedule
    # window, `LoraSpec.start`/`end`: added after the endpoints were published), so that no earlier positional
    # argument moves.
    gradio_late: tuple[str, ...] = ()
    # The video endpoint's arguments after all its others, `gradio_late`'s included (an IC-LoRA's reference video:
    # added after those were published), so that no earlier positional argument moves.
    gradio_video_last: tuple[str, ...] = ()
    name: str = ""

    def bounds(self) -> tuple[float, float]:
        """Its declared (low, high), read as declared (0 is a bound, not a missing one). A field whose reader
        needs both and lacks one is a mistake in its declaration: raised, so that a module reading it at import
        fails to import rather than check against a bound nobody declared."""
        if self.low is None or self.high is None:
            raise ValueError(f"request field {self.name!r} declares no {'low' if self.low is None else 'high'} bound")
        return self.low, self.high


def request_field(default: Any, declared: RequestField) -> Any:
    """A dataclass field with `default` that carries its declaration (read back by `engine.requests.fields_of`)."""
    return dataclasses.field(default=default, metadata={"request": declared})
