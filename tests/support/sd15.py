"""SD 1.5 LoRA files for the tiny SD 1.5 pipeline, in PEFT and kohya naming (tests of SD 1.5 and of pools)."""

from __future__ import annotations

from pathlib import Path

from serving.demo.synthetic import (
    TEXT_ATTENTION,
    UNET_ATTENTION,
    UNET_ATTENTION_FF_CONV,
    find_targets,
    kohya_metadata,
    make_lora,
    peft_metadata,
    save_lora,
)

# SD 1.5's attention blocks project in and out with 1x1 convolutions (SDXL's with Linear layers).
PROJ_CONV = (r"attentions\.\d+\.proj_(in|out)$",)


def write_sd15_loras(pipe, folder: Path) -> dict[str, str]:
    """PEFT-named (UNet and text encoder) and kohya-named (lora_unet_down_blocks_…, lora_te_…, alphas, conv) files."""
    components = {"unet": pipe.unet, "text_encoder": pipe.text_encoder}
    peft_targets = find_targets(components, {"unet": UNET_ATTENTION, "text_encoder": TEXT_ATTENTION})
    kohya_targets = find_targets(
        components, {"unet": (*UNET_ATTENTION_FF_CONV, *PROJ_CONV), "text_encoder": TEXT_ATTENTION}
    )
    peft = make_lora(peft_targets, rank=4, seed=51, fmt="peft", strength=0.3)
    kohya = make_lora(kohya_targets, rank=4, seed=52, fmt="kohya", alpha=2.0, strength=0.3, kohya_names="sd1")
    assert any(k.startswith("lora_te_text_model_encoder_layers_0_") for k in kohya)
    assert any(k.startswith("lora_unet_down_blocks_0_resnets_0_conv1.") for k in kohya)
    assert any(k.startswith("lora_unet_down_blocks_0_attentions_0_proj_in.") for k in kohya)
    save_lora(folder / "sd15_peft.safetensors", peft, peft_metadata(peft_targets, rank=4, alpha=8.0))
    save_lora(folder / "sd15_kohya.safetensors", kohya, kohya_metadata(dim=4, alpha=2.0, base_version="sd_v1"))
    return {"peft": "sd15_peft.safetensors", "kohya": "sd15_kohya.safetensors"}
