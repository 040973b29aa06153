"""Synthetic FLUX.1 LoRA files in the formats people publish, each with its diffusers-named twin.

A FLUX LoRA is made here as low-rank factors of BFL's own layers (the checkpoint layout kohya's sd-scripts,
ComfyUI and XLabs train on): a double block's fused `img_attn.qkv` (q, k and v of the image stream, stacked by
rows), its projections, MLPs and modulations; a single block's fused `linear1` (q, k, v and the MLP's input),
`linear2` and modulation; and CLIP-L's attention. It is written in one of four namings:

- `peft`: diffusers/PEFT (`transformer.transformer_blocks.0.attn.to_q.lora_A.weight`), each fused layer split
  into diffusers' modules (the same down factor, the up factor's rows for each part), with
  `lora_adapter_metadata`;
- `kohya`: sd-scripts (`lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight`, `.alpha`; `lora_te1_` CLIP);
- `comfy`: ComfyUI's and ai-toolkit's BFL names (`diffusion_model.double_blocks.0.img_attn.qkv.lora_down.weight`,
  `text_encoders.clip_l.transformer.` CLIP);
- `xlabs`: XLabs' attention processors (`double_blocks.0.processor.qkv_lora1.down.weight`), attention only,
  no alpha, no CLIP.

`twin` is the same LoRA in diffusers' names, with the alpha's scale in its up factors: what a test hands
diffusers' own loader as the reference where diffusers cannot read the file itself at the tiny pipeline's
widths (its kohya converter splits `linear1` at FLUX.1's real widths). A `sparse` LoRA writes each fused
layer as sd-scripts does when it converts a diffusers LoRA: the parts' down factors stacked, their up factors
block-diagonal.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

__all__ = ["DOUBLE", "SINGLE", "FluxFormat", "FluxLayer", "FluxLora", "flux_layers", "make_flux_lora"]

FluxFormat = Literal["peft", "kohya", "comfy", "xlabs"]

# BFL's layer in a double block -> (diffusers' modules its rows feed, in row order; XLabs' processor name).
DOUBLE: dict[str, tuple[tuple[str, ...], str | None]] = {
    "img_attn.qkv": (("attn.to_q", "attn.to_k", "attn.to_v"), "processor.qkv_lora1"),
    "img_attn.proj": (("attn.to_out.0",), "processor.proj_lora1"),
    "img_mlp.0": (("ff.net.0.proj",), None),
    "img_mlp.2": (("ff.net.2",), None),
    "img_mod.lin": (("norm1.linear",), None),
    "txt_attn.qkv": (("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"), "processor.qkv_lora2"),
    "txt_attn.proj": (("attn.to_add_out",), "processor.proj_lora2"),
    "txt_mlp.0": (("ff_context.net.0.proj",), None),
    "txt_mlp.2": (("ff_context.net.2",), None),
    "txt_mod.lin": (("norm1_context.linear",), None),
}
# The same for a single block; `qkv` is XLabs' attention-only view of `linear1` (no BFL layer of its own).
SINGLE: dict[str, tuple[tuple[str, ...], str | None]] = {
    "linear1": (("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"), None),
    "qkv": (("attn.to_q", "attn.to_k", "attn.to_v"), "processor.qkv_lora"),
    "linear2": (("proj_out",), None),
    "modulation.lin": (("norm.linear",), None),
}
_TEXT = ("q_proj", "k_proj", "v_proj", "out_proj")


@dataclass(frozen=True)
class FluxLayer:
    """One layer a FLUX LoRA adapts: its name (BFL's, or `text.<CLIP module>`), the diffusers modules its
    output rows feed (component-prefixed, in row order), their widths, and its input width."""

    name: str
    parts: tuple[str, ...]
    rows: tuple[int, ...]
    in_features: int
    xlabs: str | None = None
    # The modules' paths in the served model, where they differ from the names files use (recent transformers'
    # CLIP has no `text_model.` level; published files keep it).
    paths: tuple[str, ...] = ()

    @property
    def targets(self) -> tuple[str, ...]:
        return self.paths or self.parts


def flux_layers(
    transformer: nn.Module,
    text_encoder: nn.Module | None = None,
    *,
    double: Sequence[str] = tuple(DOUBLE),
    single: Sequence[str] = ("linear1", "linear2", "modulation.lin"),
) -> list[FluxLayer]:
    """The layers of `transformer` (its double and single blocks) and CLIP attention a LoRA would adapt."""
    modules = dict(transformer.named_modules())
    layers = []
    for kind, table, names in (("double", DOUBLE, double), ("single", SINGLE, single)):
        prefix = "transformer_blocks" if kind == "double" else "single_transformer_blocks"
        count = len(modules[prefix]) if prefix in modules else 0
        for block in range(count):
            for name in names:
                parts, xlabs = table[name]
                linears = [modules[f"{prefix}.{block}.{part}"] for part in parts]
                layers.append(
                    FluxLayer(
                        f"{kind}_blocks.{block}.{name}",
                        tuple(f"transformer.{prefix}.{block}.{part}" for part in parts),
                        tuple(int(m.out_features) for m in linears),
                        int(linears[0].in_features),
                        None if xlabs is None else f"{kind}_blocks.{block}.{xlabs}",
                    )
                )
    if text_encoder is not None:
        for name, module in text_encoder.named_modules():
            if isinstance(module, nn.Linear) and name.endswith(tuple(f"self_attn.{p}" for p in _TEXT)):
                module_name = name if name.startswith("text_model.") else f"text_model.{name}"
                layers.append(
                    FluxLayer(
                        f"text.{module_name}",
                        (f"text_encoder.{module_name}",),
                        (module.out_features,),
                        module.in_features,
                        paths=(f"text_encoder.{name}",),
                    )
                )
    return layers


@dataclass(frozen=True)
class FluxLora:
    """A FLUX LoRA's factors per layer: down (rank x in) and up (out x rank); `alpha` None: each layer's rank
    (a scale of 1), as a file without `.alpha` is read."""

    layers: tuple[FluxLayer, ...]
    downs: tuple[torch.Tensor, ...]
    ups: tuple[torch.Tensor, ...]
    alpha: float | None = None

    def file(self, fmt: FluxFormat) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """The tensors and metadata of the file in `fmt`."""
        if fmt == "peft":
            return self.twin(), _peft_metadata(self)
        if fmt == "xlabs" and self.alpha is not None:
            raise ValueError("XLabs LoRAs have no alpha; accepted: alpha=None")
        tensors: dict[str, torch.Tensor] = {}
        for layer, down, up in zip(self.layers, self.downs, self.ups, strict=True):
            stem = _stem(layer, fmt)
            if fmt == "xlabs":
                tensors[f"{stem}.down.weight"], tensors[f"{stem}.up.weight"] = down, up
                continue
            tensors[f"{stem}.lora_down.weight"], tensors[f"{stem}.lora_up.weight"] = down, up
            alpha = down.shape[0] if self.alpha is None else self.alpha
            tensors[f"{stem}.alpha"] = torch.tensor(float(alpha), dtype=down.dtype)
        return tensors, {"format": "pt"}

    def twin(self) -> dict[str, torch.Tensor]:
        """The same LoRA in diffusers' names, each fused layer split into its parts (the same down factor, the up
        factor's rows of each part); each layer's scale (alpha / its rank) is multiplied into its up factors, so
        diffusers' default alpha (the rank) reads the same update."""
        tensors: dict[str, torch.Tensor] = {}
        for layer, down, up in zip(self.layers, self.downs, self.ups, strict=True):
            scale = 1.0 if self.alpha is None else self.alpha / down.shape[0]
            start = 0
            for part, rows in zip(layer.parts, layer.rows, strict=True):
                # Copies: safetensors refuses tensors that share memory.
                tensors[f"{part}.lora_A.weight"] = down.clone()
                part_up = up[start : start + rows].clone()
                tensors[f"{part}.lora_B.weight"] = part_up if scale == 1.0 else (part_up.float() * scale).to(up.dtype)
                start += rows
        return tensors


def make_flux_lora(
    layers: Sequence[FluxLayer],
    *,
    rank: int,
    seed: int,
    strength: float = 0.3,
    alpha: float | None = None,
    sparse: bool = False,
    dtype: torch.dtype = torch.float32,
) -> FluxLora:
    """Random factors whose product changes each weight by about `strength` of its size.

    `sparse`: each fused layer as sd-scripts converts a diffusers LoRA to BFL's layout: each part's own `rank`
    down factor stacked (rank x parts in all) and the up factor block-diagonal.
    """
    generator = torch.Generator().manual_seed(seed)
    downs, ups = [], []
    for layer in layers:
        parts = len(layer.parts) if sparse else 1
        down = torch.randn((rank * parts, layer.in_features), generator=generator) / layer.in_features**0.5
        up = torch.zeros((sum(layer.rows), rank * parts))
        if sparse:
            start = 0
            for index, rows in enumerate(layer.rows):
                block = torch.randn((rows, rank), generator=generator) * (strength / rank**0.5)
                up[start : start + rows, index * rank : (index + 1) * rank] = block
                start += rows
        else:
            up = torch.randn((sum(layer.rows), rank), generator=generator) * (strength / rank**0.5)
        downs.append(down.to(dtype))
        ups.append(up.to(dtype))
    return FluxLora(tuple(layers), tuple(downs), tuple(ups), alpha)


def _stem(layer: FluxLayer, fmt: FluxFormat) -> str:
    if layer.name.startswith("text."):
        module = layer.name.removeprefix("text.")
        if fmt == "kohya":
            return "lora_te1_" + module.replace(".", "_")
        if fmt == "comfy":
            return f"text_encoders.clip_l.transformer.{module}"
        raise ValueError(f"{layer.name}: XLabs LoRAs adapt no text encoder")
    if fmt == "kohya":
        return "lora_unet_" + layer.name.replace(".", "_")
    if fmt == "comfy":
        return f"diffusion_model.{layer.name}"
    if layer.xlabs is None:
        raise ValueError(f"{layer.name}: XLabs LoRAs adapt the attention only")
    return layer.xlabs


def _peft_metadata(lora: FluxLora) -> dict[str, str]:
    """diffusers' `lora_adapter_metadata` for the twin: each component's target modules, with their rank as alpha
    (the scale is in its up factors) and each module's own rank where a fused layer's differs."""
    ranks = {
        path: int(down.shape[0]) for layer, down in zip(lora.layers, lora.downs, strict=True) for path in layer.targets
    }
    config: dict[str, object] = {}
    for component in sorted({part.partition(".")[0] for part in ranks}):
        own = {part.partition(".")[2]: rank for part, rank in ranks.items() if part.startswith(f"{component}.")}
        common = max(set(own.values()), key=list(own.values()).count)
        pattern = {module: rank for module, rank in own.items() if rank != common}
        config |= {
            f"{component}.r": common,
            f"{component}.lora_alpha": common,
            f"{component}.rank_pattern": pattern,
            f"{component}.alpha_pattern": pattern,
            f"{component}.target_modules": sorted(own),
        }
    return {"format": "pt", "lora_adapter_metadata": json.dumps(config)}
