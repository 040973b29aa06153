"""Each DiT family's pool beside the SDXL one (tests/engine/pools): the pools it is served with, its LoRA files and
stand-in Hub repos (cards, metadata, names, one made for a wider model), a mixed run's LoRA sets and the refusals
mixed into it. The per-family pool tests keep their routing; the mixed runs are one test over these rows
(tests/engine/pools/test_pools_mixed.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers import FluxTransformer2DModel

from engine.errors import IncompatibleLoraError, InvalidRequestError
from families import IDENTITIES, Family
from families.krea2 import RAW_ID as KREA2_RAW
from serving.demo.synthetic import kohya_metadata, save_lora
from serving.demo.synthetic_flux import flux_layers, make_flux_lora
from tests.support import chroma, flux2, krea2, qwen_image, zimage
from tests.support.flux import CASES as FLUX_CASES
from tests.support.flux import write_flux_loras
from tests.support.loras import SD15, SDXL, card, kohya_file, peft_file, sft
from tests.support.tiny import TinyModels

Writer = Callable[[TinyModels, Any, Path], None]


@dataclass(frozen=True)
class PoolRefusal:
    """Every `every`-th request of the run (at `at`), `loras` (sent naming `base`, "" for none) is refused with
    `error`, its message matching `match` (None: any) and holding each of `fragments`."""

    every: int
    at: int
    error: type[Exception]
    match: str | None
    loras: tuple[str, ...]
    base: str = ""
    fragments: tuple[str, ...] = ()


@dataclass(frozen=True)
class PoolFamily:
    """One family's pools (`served`, SDXL first), files (`write(models, hub, folder)`), mixed run (`mixed`'s LoRA
    sets in turn; `clients` requests from eight clients; `steps` requests in the bit-exact run, picked by
    `rng_seed`'s generator, or in order when None, at `run_steps` steps, None: the request's) and refusals; the LoRAs
    every transport sends it."""

    family: Family
    served: tuple[Family, ...]
    write: Writer
    mixed: tuple[tuple[str, ...], ...]
    clients: int
    steps: int
    refusals: tuple[PoolRefusal, ...]
    rng_seed: int | None = None
    run_steps: int | None = 1
    # A LoRA carded for the family and one carded for it whose shapes fit nothing (its 400 holds `wide_fragments`).
    card: str = ""
    wide: str = ""
    wide_fragments: tuple[str, ...] = ()

    @property
    def model_id(self) -> str:
        return IDENTITIES[self.family].model_id

    def pipelines(self, models: TinyModels) -> list[tuple[Any, str]]:
        return [(models.loaded(f), IDENTITIES[f].model_id) for f in self.served]


def _flux_files(models: TinyModels, hub: Any, folder: Path) -> None:
    sdxl, flux = models.loaded(Family.SDXL).pipe, models.loaded(Family.FLUX).pipe
    written = write_flux_loras(flux, folder)
    # Metadata alone: kohya's FLUX metadata (ss_base_model_version flux1) over BFL names, no card.
    kohya, _ = make_flux_lora(flux_layers(flux.transformer), rank=4, seed=31, alpha=2.0).file("kohya")
    save_lora(folder / "flux_meta.safetensors", kohya, kohya_metadata(dim=4, alpha=2.0, base_version="flux1"))
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(sdxl, seed=32))
    assert {"xlabs", "comfy_linear1", "peft"} <= set(written)
    # By card: a FLUX LoRA, one made for a wider FLUX (its shapes fit nothing served), an SDXL and an SD 1.5 one.
    twin = make_flux_lora(flux_layers(flux.transformer, flux.text_encoder), rank=4, seed=36, strength=1.0).twin()
    model_id = IDENTITIES[Family.FLUX].model_id
    hub.add_repo("flux-pools/flux-card", {"README.md": card(model_id), "lora.safetensors": sft(twin)})
    with torch.device("meta"):
        wider = FluxTransformer2DModel(num_layers=1, num_single_layers=1, num_attention_heads=3, attention_head_dim=16)
    wide = make_flux_lora(flux_layers(wider), rank=2, seed=33).twin()
    hub.add_repo("flux-pools/flux-wide", {"README.md": card(model_id), "lora.safetensors": sft(wide)})
    hub.add_repo("flux-pools/sdxl-card", {"README.md": card(SDXL), "lora.safetensors": peft_file(sdxl, seed=34)})
    hub.add_repo("flux-pools/sd15-card", {"README.md": card(SD15), "lora.safetensors": peft_file(sdxl, seed=35)})


def _flux2_files(models: TinyModels, hub: Any, folder: Path) -> None:
    sdxl, klein = models.loaded(Family.SDXL).pipe, models.loaded(Family.FLUX2).pipe
    flux2.write_flux2_loras(klein, folder)
    write_flux_loras(models.loaded(Family.FLUX).pipe, folder)
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(sdxl, seed=72))
    made = flux2.factors(klein.transformer, seed=73)
    # By metadata (musubi-tuner's FLUX.2 version), which the judgement reads before any name.
    meta = kohya_metadata(dim=4, alpha=4.0, base_version="flux_2")
    save_lora(folder / "flux2_meta.safetensors", flux2.lora_file(made, "peft_bfl"), meta)
    model_id = IDENTITIES[Family.FLUX2].model_id
    hub.add_repo(
        "flux2-pools/card", {"README.md": card(model_id), "lora.safetensors": sft(flux2.lora_file(made, "aitk"))}
    )
    # Carded klein but made for a klein of another width: its factors fit nothing.
    wide = flux2.lora_file({flux2.ATTENTION[0]: (torch.ones(2, 64), torch.ones(3 * 64, 2))}, "aitk")
    hub.add_repo("flux2-pools/wide", {"README.md": card(model_id), "lora.safetensors": sft(wide)})
    hub.add_repo("flux2-pools/sdxl-card", {"README.md": card(SDXL), "lora.safetensors": peft_file(sdxl, seed=75)})


def _zimage_files(models: TinyModels, hub: Any, folder: Path) -> None:
    sdxl, pipe = models.loaded(Family.SDXL).pipe, models.loaded(Family.ZIMAGE).pipe
    zimage.write_zimage_loras(pipe, folder)
    write_flux_loras(models.loaded(Family.FLUX).pipe, folder, cases=FLUX_CASES[:1])
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(sdxl, seed=52))
    # Metadata alone routes it: musubi-tuner's Z-Image version over PEFT's own names, which no family claims.
    made = zimage.factors(pipe.transformer, seed=53)
    peft = zimage.lora_file(made, "peft", None)
    odd = {k.replace("transformer.", "base_model.model.", 1): v for k, v in peft.items()}
    save_lora(folder / "zimage_meta.safetensors", odd, kohya_metadata(dim=4, alpha=4.0, base_version="zimage"))
    model_id = IDENTITIES[Family.ZIMAGE].model_id
    hub.add_repo("zimage-pools/card", {"README.md": card(model_id), "lora.safetensors": sft(peft)})
    wide = zimage.lora_file({m: (torch.ones(2, 64), torch.ones(64, 2)) for m in zimage.MODULES[:2]}, "peft", None)
    hub.add_repo("zimage-pools/wide", {"README.md": card(model_id), "lora.safetensors": sft(wide)})
    hub.add_repo("zimage-pools/sdxl-card", {"README.md": card(SDXL), "lora.safetensors": peft_file(sdxl, seed=54)})


def _qwen_files(models: TinyModels, hub: Any, folder: Path) -> None:
    sdxl, pipe = models.loaded(Family.SDXL).pipe, models.loaded(Family.QWEN_IMAGE).pipe
    qwen_image.write_qwen_loras(pipe, folder)
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(sdxl, seed=62))
    # Metadata decides it: musubi-tuner's Qwen-Image version over attention-only diffusers names, which FLUX.1's
    # double blocks share (its names alone leave FLUX.1 and Qwen-Image).
    made = qwen_image.factors(pipe.transformer, seed=63)
    attention = {m: f for m, f in made.items() if ".attn.to_" in m}
    metadata = kohya_metadata(dim=4, alpha=4.0, base_version="qwen_image")
    save_lora(folder / "qwen_meta.safetensors", qwen_image.lora_file(attention, "peft", None), metadata)
    model_id = IDENTITIES[Family.QWEN_IMAGE].model_id
    full = sft(qwen_image.lora_file(made, "peft", None))
    hub.add_repo("qwen-pools/card", {"README.md": card(model_id), "lora.safetensors": full})
    wide = {m: (torch.ones(2, 64), torch.ones(64, 2)) for m in qwen_image.MODULES[:2]}
    hub.add_repo(
        "qwen-pools/wide",
        {"README.md": card(model_id), "lora.safetensors": sft(qwen_image.lora_file(wide, "peft", None))},
    )


def _chroma_files(models: TinyModels, hub: Any, folder: Path) -> None:
    sdxl, pipe = models.loaded(Family.SDXL).pipe, models.loaded(Family.CHROMA).pipe
    chroma.write_chroma_loras(pipe, folder)
    write_flux_loras(models.loaded(Family.FLUX).pipe, folder, cases=FLUX_CASES[:1])
    chroma.write_flux_loras_for_chroma(models.loaded(Family.FLUX).pipe, folder)
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(sdxl, seed=82))
    # Metadata decides it: sd-scripts' ModelSpec architecture for Chroma over BFL's blocks alone, which FLUX.1's
    # names share (its names alone leave FLUX.1 and Chroma: without a named base such a request is a 400).
    tensors, _, twin = chroma.chroma_file(pipe.transformer, chroma.ChromaCase("meta", "kohya", linear1=False, seed=83))
    save_lora(folder / "chroma_meta.safetensors", tensors, {"modelspec.architecture": "chroma/lora"})
    model_id = IDENTITIES[Family.CHROMA].model_id
    hub.add_repo("chroma-pools/card", {"README.md": card(model_id), "lora.safetensors": sft(twin)})
    wide = {f"transformer.{chroma.WIDE_MODULE}.lora_{ab}.weight": torch.ones(shape) for ab, shape in WIDE_FACTORS}
    hub.add_repo("chroma-pools/wide", {"README.md": card(model_id), "lora.safetensors": sft(wide)})
    hub.add_repo("chroma-pools/sdxl-card", {"README.md": card(SDXL), "lora.safetensors": peft_file(sdxl, seed=84)})


# A Chroma LoRA made for a wider Chroma (64 wide, where the tiny one is 32): its factors fit no served layer.
WIDE_FACTORS = (("A", (2, 64)), ("B", (64, 2)))


def _krea2_files(models: TinyModels, hub: Any, folder: Path) -> None:
    sdxl, pipe = models.loaded(Family.SDXL).pipe, models.loaded(Family.KREA2).pipe
    krea2.write_krea2_loras(pipe, folder)
    qwen_image.write_qwen_loras(models.loaded(Family.QWEN_IMAGE).pipe, folder, cases=qwen_image.CASES[:1])
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(sdxl, seed=82))
    # Attention-only diffusers names, which Qwen-Image's (and FLUX.1's) share: alone, the widths decide; with
    # ai-toolkit's metadata, the metadata.
    made = krea2.factors(pipe.transformer, seed=83)
    attention = krea2.lora_file(
        {m: f for m, f in made.items() if m.startswith("transformer_blocks.0.attn.to_")}, "peft"
    )
    save_lora(folder / "krea2_attn.safetensors", attention)
    save_lora(folder / "krea2_meta.safetensors", attention, kohya_metadata(dim=4, alpha=4.0, base_version="krea2"))
    model_id = IDENTITIES[Family.KREA2].model_id
    hub.add_repo(
        "krea2-pools/card", {"README.md": card(model_id), "lora.safetensors": sft(krea2.lora_file(made, "aitk"))}
    )
    # Trained on Raw (its card's base), its widget at Raw's settings: it runs on the Turbo pool at Turbo's, with a
    # note. One trained on Turbo with widget settings gets them.
    raw = sft(krea2.lora_file(krea2.factors(pipe.transformer, seed=84), "comfy"))
    hub.add_repo(
        "krea2-pools/raw-card", {"README.md": card(KREA2_RAW, widget=_widget(28, 4.5)), "lora.safetensors": raw}
    )
    hub.add_repo(
        "krea2-pools/turbo-settings", {"README.md": card(model_id, widget=_widget(3, 1.5)), "lora.safetensors": raw}
    )
    wide = krea2.lora_file({m: (torch.ones(2, 64), torch.ones(64, 2)) for m in krea2.MODULES[:1]}, "peft")
    hub.add_repo("krea2-pools/wide", {"README.md": card(model_id), "lora.safetensors": sft(wide)})
    hub.add_repo("krea2-pools/sdxl-card", {"README.md": card(SDXL), "lora.safetensors": peft_file(sdxl, seed=85)})


def _widget(steps: int, guidance: float) -> list[dict[str, object]]:
    """A card's widget example recommending `steps` at `guidance` (what `lora_catalog.hints.card_hints` reads)."""
    parameters = {"num_inference_steps": steps, "guidance_scale": guidance}
    return [{"text": "a lighthouse", "parameters": parameters}]


def _two_bases(every: int, at: int, match: str | None, *loras: str, base: str = "") -> PoolRefusal:
    return PoolRefusal(every, at, InvalidRequestError, match, loras, base)


ZIMAGE_WIDE = r"do not fit transformer\.layers\.0\.attention\.to_"
QWEN_WIDE = r"do not fit transformer\.transformer_blocks\.0"
KREA2_WIDE = r"do not fit transformer\.transformer_blocks\.0\.attn\.to_q"
KLEIN = IDENTITIES[Family.FLUX2].model_id

POOLS = (
    PoolFamily(
        Family.FLUX,
        (Family.SDXL, Family.FLUX),
        _flux_files,
        (
            (),
            ("local:flux_kohya_linear1.safetensors",),
            ("flux-pools/sdxl-card",),
            ("local:flux_xlabs.safetensors",),
            ("local:sdxl_kohya.safetensors",),
            ("flux-pools/flux-card",),
            ("local:flux_comfy.safetensors", "local:flux_peft.safetensors"),
            ("local:flux_meta.safetensors",),
        ),
        clients=24,
        steps=24,
        refusals=(
            PoolRefusal(6, 2, IncompatibleLoraError, r"do not fit", ("flux-pools/flux-wide",)),
            _two_bases(6, 5, None, "flux-pools/flux-card", "flux-pools/sdxl-card"),
        ),
        rng_seed=5,
        card="flux-pools/flux-card",
        wide="flux-pools/flux-wide",
        wide_fragments=("do not fit transformer.", "(32, 32)"),
    ),
    PoolFamily(
        Family.ZIMAGE,
        (Family.SDXL, Family.FLUX, Family.ZIMAGE),
        _zimage_files,
        (
            (),
            ("zimage-pools/card",),
            ("local:sdxl_kohya.safetensors",),
            ("local:flux_peft.safetensors",),
            ("zimage-pools/sdxl-card",),
            ("local:zimage_kohya.safetensors",),
            ("local:zimage_dotted.safetensors", "local:zimage_comfy.safetensors"),
            ("local:zimage_peft.safetensors",),
        ),
        clients=16,
        steps=12,
        refusals=(
            PoolRefusal(
                4,
                1,
                IncompatibleLoraError,
                r"do not fit transformer\.layers\.0\.attention\.to_",
                ("zimage-pools/wide",),
                fragments=("(24, 24)",),
            ),
            _two_bases(4, 3, r"share one base model", "zimage-pools/card", "zimage-pools/sdxl-card"),
        ),
        card="zimage-pools/card",
        wide="zimage-pools/wide",
        wide_fragments=("do not fit transformer.layers.0.attention.to_", "(24, 24)"),
    ),
    PoolFamily(
        Family.FLUX2,
        (Family.SDXL, Family.FLUX, Family.FLUX2),
        _flux2_files,
        (
            (),
            ("local:flux2_kohya.safetensors",),
            ("flux2-pools/sdxl-card",),
            ("local:flux2_comfy.safetensors",),
            ("local:sdxl_kohya.safetensors",),
            ("flux2-pools/card",),
            ("local:flux2_peft.safetensors", "local:flux2_expanded.safetensors"),
            ("local:flux2_meta.safetensors",),
        ),
        clients=16,
        steps=16,
        refusals=(
            PoolRefusal(5, 2, IncompatibleLoraError, r"do not fit", ("flux2-pools/wide",)),
            _two_bases(
                5, 4, r"share one base model", "local:flux_peft.safetensors", base=IDENTITIES[Family.FLUX2].model_id
            ),
        ),
        rng_seed=7,
        card="flux2-pools/card",
        wide="flux2-pools/wide",
        wide_fragments=("(56, 56)",),
    ),
    PoolFamily(
        Family.QWEN_IMAGE,
        (Family.SDXL, Family.QWEN_IMAGE),
        _qwen_files,
        (
            (),
            ("local:qwen_kohya.safetensors",),
            ("local:sdxl_kohya.safetensors",),
            ("qwen-pools/card",),
            ("local:qwen_comfy.safetensors", "local:qwen_bare.safetensors"),
            ("local:qwen_meta.safetensors",),
        ),
        clients=18,
        steps=12,
        refusals=(
            PoolRefusal(
                4,
                1,
                IncompatibleLoraError,
                r"do not fit transformer\.transformer_blocks\.0",
                ("qwen-pools/wide",),
                fragments=("(72, 72)",),
            ),
        ),
        run_steps=None,
        card="qwen-pools/card",
        wide="qwen-pools/wide",
        wide_fragments=("do not fit transformer.transformer_blocks.0", "(72, 72)"),
    ),
    PoolFamily(
        Family.CHROMA,
        (Family.SDXL, Family.FLUX, Family.CHROMA),
        _chroma_files,
        (
            (),
            ("chroma-pools/card",),
            ("local:sdxl_kohya.safetensors",),
            ("local:chroma_peft.safetensors",),
            ("local:flux_peft.safetensors",),
            ("local:chroma_meta.safetensors",),
            ("chroma-pools/sdxl-card",),
            ("chroma-pools/card", "local:chroma_peft.safetensors"),
        ),
        clients=16,
        steps=12,
        refusals=(
            PoolRefusal(
                4, 1, IncompatibleLoraError, r"do not fit transformer\.transformer_blocks\.0", ("chroma-pools/wide",)
            ),
            # A FLUX.1 LoRA adapting FLUX.1's modulations (its tensors route it to the FLUX.1 pool), sent naming the
            # Chroma base.
            _two_bases(
                4,
                3,
                r"share one base model",
                "local:flux1_with_modulations.safetensors",
                base=IDENTITIES[Family.CHROMA].model_id,
            ),
        ),
        card="chroma-pools/card",
        wide="chroma-pools/wide",
        wide_fragments=("do not fit transformer.transformer_blocks.0.attn.to_q", "(32, 32)"),
    ),
    PoolFamily(
        Family.KREA2,
        (Family.SDXL, Family.QWEN_IMAGE, Family.KREA2),
        _krea2_files,
        (
            (),
            ("krea2-pools/card",),
            ("local:sdxl_kohya.safetensors",),
            ("local:krea2_kohya.safetensors",),
            ("local:qwen_peft.safetensors",),
            ("krea2-pools/raw-card",),
            ("local:krea2_comfy_kohya.safetensors", "local:krea2_peft.safetensors"),
            ("local:krea2_attn.safetensors",),
            ("local:krea2_aitk.safetensors",),
        ),
        clients=18,
        steps=12,
        refusals=(
            PoolRefusal(4, 1, IncompatibleLoraError, KREA2_WIDE, ("krea2-pools/wide",), fragments=("(104, 104)",)),
            _two_bases(4, 3, r"share one base model", "krea2-pools/card", "krea2-pools/sdxl-card"),
        ),
        # Its Qwen-Image pool's scheduler (shift_terminal) divides by zero at one step: the requests' own steps.
        run_steps=None,
        card="krea2-pools/card",
        wide="krea2-pools/wide",
        wide_fragments=("do not fit transformer.transformer_blocks.0.attn.to_q", "(104, 104)"),
    ),
)
