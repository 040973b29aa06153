"""The offline demo's LoRAs for the pools it loads in the background (`engine.settings.DEMO_LATER_POOLS`).

One for each: a video LoRA for the tiny Wan pool, an editing LoRA for the tiny FLUX.2 [klein] pool (which edits
from several reference images) and one for the quantized (fp8) Z-Image pool, where a LoRA runs as a branch beside
the stored fp8 weights. Each is random low-rank factors over its transformer's attention projections in
diffusers/PEFT naming (`transformer.<module>.lora_A.weight`), with the ModelSpec metadata the local catalogue
reads, written once like `serving.demo.loras` writes the others (its own marker: the two sets are made at
different times, each when its pools have loaded).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from engine.pipeline.loading import Pipeline
from engine.settings import DEMO_LATER_POOLS
from serving.demo.loras import DemoLora, write_demo_lora
from serving.demo.synthetic import find_targets, make_lora, peft_metadata

__all__ = ["EDIT_LORA", "LATER_LORAS", "QUANTIZED_LORA", "VIDEO_LORA", "ensure_later_loras", "later_loras"]

logger = logging.getLogger(__name__)

# The later pools' bases, in the registry's order (`FamilyIdentity.demo_later`): Z-Image's (fp8), FLUX.2 [klein]'s
# and Wan's; a family joining them brings its LoRA here (this unpacking fails till).
ZIMAGE_MODEL_ID, KLEIN_MODEL_ID, WAN_MODEL_ID = (pool.base_model_id for pool in DEMO_LATER_POOLS)
_FORMAT = 1
_MARKER = "switchboard_demo_later.json"
# Every attention projection these transformers have (Wan's attn1/attn2, FLUX.2's attn, Z-Image's attention).
_ATTENTION = (r"(attn\d?|attention)\.(to_q|to_k|to_v|to_out\.0)$",)
ARCHITECTURES = {
    WAN_MODEL_ID: "wan2.1-t2v-1.3b/lora",
    KLEIN_MODEL_ID: "flux-2-klein-4b/lora",
    ZIMAGE_MODEL_ID: "z-image-turbo/lora",
}

VIDEO_LORA = DemoLora(
    "drift_reel",
    "Drift Reel",
    "drift reel",
    "apache-2.0",
    "Wan 2.1 T2V, a video LoRA: every frame of the clip changes.",
    "peft",
    seed=401,
    strength=2.0,
    base=WAN_MODEL_ID,
)
EDIT_LORA = DemoLora(
    "collage_ink",
    "Collage Ink",
    "collage ink",
    "apache-2.0",
    "FLUX.2 [klein], an editing LoRA: edit image 1 from references in image 2 and 3.",
    "peft",
    seed=402,
    strength=1.0,
    base=KLEIN_MODEL_ID,
)
QUANTIZED_LORA = DemoLora(
    "fp8_frost",
    "FP8 Frost",
    "fp8 frost",
    "mit",
    "Z-Image Turbo in fp8: the LoRA runs as a branch beside the fp8 weights, which it never writes.",
    "peft",
    seed=403,
    strength=2.0,
    base=ZIMAGE_MODEL_ID,
)
LATER_LORAS = (QUANTIZED_LORA, EDIT_LORA, VIDEO_LORA)


def later_loras(served: tuple[str, ...]) -> tuple[DemoLora, ...]:
    """The later pools' LoRAs for the served bases."""
    return tuple(lora for lora in LATER_LORAS if lora.base in served)


def ensure_later_loras(folder: Path, pipes: Mapping[str, Pipeline]) -> tuple[Path, ...]:
    """Write the LoRA files of the later pools in `pipes` (base repo id: pipeline) into `folder`, once."""
    loras = later_loras(tuple(pipes))
    marker = folder / _MARKER
    wanted = {"format": _FORMAT, "loras": [lora.stem for lora in loras]}
    paths = tuple(folder / lora.file_name for lora in loras)
    if _read(marker) == wanted and all(p.is_file() for p in paths):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    logger.info("writing %d demo LoRAs for the background pools to %s", len(loras), folder)
    for lora, path in zip(loras, paths, strict=True):
        targets = find_targets({"transformer": pipes[lora.base].transformer}, {"transformer": _ATTENTION})
        tensors = make_lora(targets, rank=lora.rank, seed=lora.seed, strength=lora.strength)
        metadata = peft_metadata(targets, rank=lora.rank, alpha=float(lora.rank))
        write_demo_lora(path, lora, dict(tensors), metadata, ARCHITECTURES[lora.base])
    marker.write_text(json.dumps(wanted))
    return paths


def _read(marker: Path) -> object:
    try:
        return json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
