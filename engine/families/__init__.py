"""Base-model families: one module each (`sdxl`, `sd15`, `sd2`) declaring everything its family needs.

`spec` holds the shape a family fills in (`FamilySpec`); `registry` lists the served families, one line each,
and finds a family's spec by base repo id or by `lora_catalog.entries.Family`. Shared helpers hold only what
several families truly share: `unet` (UNet/CLIP LoRA names and widths), `stable_diffusion` (SD 1.x and 2.x),
`tiny` (the tiny pipelines' tokenizer, text configs, VAE and scheduler).
"""
