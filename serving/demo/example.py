"""The example input image: a small landscape drawn here, so the repository bundles no third-party picture.

`serving/demo/example.png` is what `draw_example` draws (`python -m serving.demo.example` writes it again; a test
holds the two equal). The UI offers it as an example input with `EXAMPLE_PROMPT` at `EXAMPLE_STRENGTH`: a scene
with plain shapes and a clear horizon, which image-to-image visibly keeps while a prompt and a LoRA restyle it.
The offline demo's UI also offers an example for each of its capabilities, each with a LoRA of the demo's
(`demo_examples`): a schedule (`schedule_lora()` active on a window of the steps), an edit from two references
(Collage Ink on FLUX.2 [klein]) and a short video (Drift Reel on Wan).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image, ImageDraw

if TYPE_CHECKING:
    from serving.demo.loras import DemoLora

__all__ = [
    "EDIT_PROMPT",
    "EXAMPLE_IMAGE",
    "EXAMPLE_PROMPT",
    "EXAMPLE_SIDE",
    "EXAMPLE_STRENGTH",
    "REFERENCE_IMAGES",
    "SCHEDULE_SCALE",
    "SCHEDULE_WINDOW",
    "DemoExample",
    "demo_examples",
    "draw_example",
    "draw_reference",
    "schedule_lora",
    "schedule_prompt",
]

EXAMPLE_IMAGE = Path(__file__).with_name("example.png")
# 256 px: the largest tiny preset (the offline demo's pools make 64-256 px images); a real pool resizes it.
EXAMPLE_SIDE = 256
EXAMPLE_PROMPT = "a lake in the mountains at sunset, oil painting"
EXAMPLE_STRENGTH = 0.6
# The example edit from two references (a pool that takes them: FLUX.2 [klein] in the offline demo, with its
# editing LoRA, whose trigger leads the prompt): the example is image 1, `REFERENCE_IMAGES` images 2 and 3.
REFERENCE_IMAGES = tuple(EXAMPLE_IMAGE.with_name(f"reference-{n}.png") for n in (2, 3))
EDIT_PROMPT = "collage ink, the lake of image 1 in the colours of image 2, with the pattern of image 3"
# The example schedule (issue 51): a LoRA of the default demo pool at its scale on the first half of the steps and
# at 0 after (Forge's `<lora:name:1:start=0:end=0.5>`): the LoRA sets the picture's layout, the base finishes it.
SCHEDULE_SCALE = 1.0
SCHEDULE_WINDOW = (0.0, 0.5)


def schedule_lora() -> DemoLora:
    """The example schedule's LoRA: Pixel Drift, of the default demo pool."""
    # Imported when asked, not with this module: the demo's LoRA tables live beside their makers (torch), and
    # `import app` (which imports this module through the UI) loads no torch (tests/serving/test_start.py).
    from serving.demo.loras import DEMO_LORAS

    return next(lora for lora in DEMO_LORAS if lora.stem == "pixel_drift")


def schedule_prompt() -> str:
    """The example schedule's prompt, led by its LoRA's trigger."""
    return f"{schedule_lora().trigger}, a fox in a forest at sunset"


# The example video's scene, after its LoRA's trigger: motion a clip shows.
_VIDEO_SCENE = "a paper boat drifting down a river at dawn"


@dataclass(frozen=True)
class DemoExample:
    """One of the offline demo's examples: the form it fills (`form_values`, by the UI form's names:
    `serving.ui.history.FORM`), LoRA 1 among it, on the base its LoRA was made for (the base filter is set to it,
    so the form shows that pool's controls: a video's frames, the reference slots)."""

    elem_id: str
    label: str
    lora: DemoLora
    prompt: str
    scale: float = 1.0
    window: tuple[float, float] = (0.0, 1.0)
    # Image 1 (the editor's), then the further references (Image 2, ...); none: text-to-image.
    images: tuple[Path, ...] = ()

    def form_values(self) -> dict[str, Any]:
        """The form's fields this example sets (`source` and `references` as paths: the editor's background and
        the reference slots)."""
        start, end = self.window
        values: dict[str, Any] = {"base": self.lora.base, "prompt": self.prompt, "lora": self.lora.ref}
        values |= {"lora_scale": self.scale, "lora_start": start, "lora_end": end}
        if self.images:
            values |= {"source": str(self.images[0]), "references": [str(path) for path in self.images[1:]]}
        return values


def demo_examples() -> tuple[DemoExample, ...]:
    """The offline demo's examples, one per capability it shows beside the plain image: a schedule, an edit from
    two references and a video, each with its pool's LoRA (the UI shows those whose base it serves)."""
    # Imported when asked, as `schedule_lora` does (the later pools' LoRAs live beside their maker, with torch).
    from serving.demo.later_loras import EDIT_LORA, VIDEO_LORA

    lora = schedule_lora()
    return (
        DemoExample(
            "schedule-examples",
            f"Example schedule: {lora.title} on the first half of the steps only",
            lora,
            schedule_prompt(),
            SCHEDULE_SCALE,
            SCHEDULE_WINDOW,
        ),
        DemoExample(
            "reference-examples",
            f"Example edit: image 1 with images 2 and 3, {EDIT_LORA.title} on FLUX.2 [klein]",
            EDIT_LORA,
            EDIT_PROMPT,
            images=(EXAMPLE_IMAGE, *REFERENCE_IMAGES),
        ),
        DemoExample(
            "video-examples",
            f"Example video: {VIDEO_LORA.title} on Wan 2.1",
            VIDEO_LORA,
            f"{VIDEO_LORA.trigger}, {_VIDEO_SCENE}",
        ),
    )


_SKY_TOP, _SKY_BOTTOM = (42, 56, 120), (250, 170, 110)
_HORIZON = 0.62


def draw_example(side: int = EXAMPLE_SIDE) -> Image.Image:
    """A sunset over mountains and a lake, with a tree: an RGB image `side` px square, the same every time."""
    image = Image.new("RGB", (side, side))
    draw = ImageDraw.Draw(image)
    horizon = round(side * _HORIZON)
    for y in range(horizon):
        t = y / max(horizon - 1, 1)
        draw.line([(0, y), (side, y)], fill=_mix(_SKY_TOP, _SKY_BOTTOM, t))
    s = side / 256  # the shapes are laid out on a 256 px canvas and scaled
    draw.ellipse(_box(s, 196, 30, 232, 66), fill=(255, 214, 120))
    draw.polygon(_points(s, (0, 159), (60, 80), (118, 159)), fill=(70, 62, 96))
    draw.polygon(_points(s, (80, 159), (170, 62), (256, 159)), fill=(92, 78, 110))
    draw.polygon(_points(s, (148, 92), (170, 62), (192, 92), (170, 84)), fill=(236, 232, 240))
    for y in range(horizon, side):
        t = (y - horizon) / max(side - horizon - 1, 1)
        draw.line([(0, y), (side, y)], fill=_mix((204, 130, 104), (30, 50, 90), t))
    # The sun's reflection: a few bright strokes on the water.
    for row, half in ((168, 18), (178, 12), (190, 8)):
        draw.line(_points(s, (214 - half, row), (214 + half, row)), fill=(255, 200, 130), width=max(1, round(2 * s)))
    draw.polygon(_points(s, (0, 256), (0, 200), (70, 214), (120, 256)), fill=(40, 86, 52))
    draw.rectangle(_box(s, 36, 150, 44, 212), fill=(74, 50, 34))
    draw.ellipse(_box(s, 14, 110, 66, 166), fill=(46, 110, 62))
    return image


def draw_reference(n: int, side: int = EXAMPLE_SIDE) -> Image.Image:
    """Reference image `n` (2 or 3) of the example edit: a palette of bands (2) or a pattern of dots (3)."""
    image = Image.new("RGB", (side, side), (250, 244, 230))
    draw = ImageDraw.Draw(image)
    if n == 2:
        colours = ((214, 64, 69), (242, 158, 76), (241, 211, 96), (72, 164, 150), (52, 84, 150))
        band = side / len(colours)
        for index, colour in enumerate(colours):
            draw.rectangle((0, index * band, side, (index + 1) * band), fill=colour)
        return image
    step = side / 8
    for row in range(8):
        for column in range(8):
            x, y = (column + 0.5) * step, (row + 0.5) * step
            r = step * (0.2 + 0.2 * ((row + column) % 2))
            draw.ellipse((x - r, y - r, x + r, y + r), fill=(30, 60, 110) if (row * column) % 3 else (200, 90, 60))
    return image


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> tuple[int, int, int]:
    return (round(a[0] + (b[0] - a[0]) * t), round(a[1] + (b[1] - a[1]) * t), round(a[2] + (b[2] - a[2]) * t))


def _points(s: float, *points: tuple[int, int]) -> list[tuple[float, float]]:
    return [(x * s, y * s) for x, y in points]


def _box(s: float, x0: int, y0: int, x1: int, y1: int) -> tuple[float, float, float, float]:
    return (x0 * s, y0 * s, x1 * s, y1 * s)


if __name__ == "__main__":
    draw_example().save(EXAMPLE_IMAGE, format="PNG", optimize=True)
    for number, path in zip((2, 3), REFERENCE_IMAGES, strict=True):
        draw_reference(number).save(path, format="PNG", optimize=True)
    for path in (EXAMPLE_IMAGE, *REFERENCE_IMAGES):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
