"""What the shapes of a LoRA over BFL's blocks say: FLUX.1's and FLUX.2's share the names but not the widths.

Both name their blocks' layers alike (BFL's `double_blocks.N.img_mlp.0`, `single_blocks.N.linear1`; kohya's
`lora_unet_` spelling of them), but FLUX.1's MLP is 4x the hidden width (GELU) and FLUX.2's a 3x SwiGLU, whose
input projection is twice its hidden width. So, whatever the hidden width, each such layer's output rows over
its input width (or the reverse) is fixed per architecture: the single block's fused `linear1` (q, k, v and the
MLP's input), its `linear2` (attention and MLP out), the double blocks' MLP in and out. A LoRA showing one of
these ratios rules the other architecture out. FLUX.2 [klein] and [dev] share every name and ratio; their hidden
widths differ ([dev]'s row declares its own: `engine.families.flux2_dev.WIDTHS`). Torch-free: the header's shapes
are enough.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["FLUX1_RATIOS", "FLUX2_RATIOS", "contradicts"]

Shapes = Mapping[str, tuple[int, ...]]

# Which layer a (lower-cased) factor name belongs to, in BFL's, ComfyUI's and kohya's spellings, and whether its
# ratio is output rows over input width ("out") or input width over output rows ("in").
_LAYERS = (
    ("linear1", "out", re.compile(r"single_blocks[._]\d+[._]linear1[._]")),
    ("linear2", "in", re.compile(r"single_blocks[._]\d+[._]linear2[._]")),
    ("mlp_in", "out", re.compile(r"double_blocks[._]\d+[._](img|txt)_mlp[._]0[._]")),
    ("mlp_out", "in", re.compile(r"double_blocks[._]\d+[._](img|txt)_mlp[._]2[._]")),
)
# FLUX.1: q, k, v and a 4x MLP in linear1 (3 + 4), attention and MLP out in linear2 (1 + 4), a 4x MLP.
FLUX1_RATIOS = {"linear1": 7, "linear2": 5, "mlp_in": 4, "mlp_out": 4}
# FLUX.2: q, k, v and the SwiGLU's 2 x 3x input in linear1 (3 + 6), attention and MLP out (1 + 3), a 3x MLP.
FLUX2_RATIOS = {"linear1": 9, "linear2": 4, "mlp_in": 6, "mlp_out": 3}
_DOWN = (".lora_down.weight", ".lora_a.weight", ".lora.down.weight")
_UP = (".lora_up.weight", ".lora_b.weight", ".lora.up.weight")


def _ratios(shapes: Shapes) -> dict[str, set[float]]:
    """Each BFL layer kind a LoRA adapts, with the width ratios its (down, up) factor pairs show."""
    downs: dict[str, tuple[int, ...]] = {}
    ups: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        lowered = name.lower()
        for suffixes, into in ((_DOWN, downs), (_UP, ups)):
            for suffix in suffixes:
                if lowered.endswith(suffix) and len(shape) >= 2:
                    into[lowered.removesuffix(suffix)] = shape
    found: dict[str, set[float]] = {}
    for stem, down in downs.items():
        up = ups.get(stem)
        if up is None:
            continue
        for kind, direction, pattern in _LAYERS:
            if pattern.search(stem + "."):
                rows, width = int(up[0]), int(down[1])
                ratio = rows / width if direction == "out" else width / rows
                found.setdefault(kind, set()).add(ratio)
    return found


def contradicts(ratios: Mapping[str, int], shapes: Shapes) -> bool:
    """The factors adapt a BFL block layer at a width ratio other than `ratios` gives it (another architecture)."""
    return any(seen != {ratios[kind]} for kind, seen in _ratios(shapes).items())
