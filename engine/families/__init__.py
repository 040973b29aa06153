"""Base-model families: one module each (`sdxl`, `sd15`, `sd2`, `flux`, `zimage`, `flux_kontext`) declaring
everything it needs.

`spec` holds the shape a family fills in (`FamilySpec`, which holds the family's torch-free identity from the
top-level `families` package); `registry` finds a family's spec by base repo id or by `families.Family`.
Shared helpers hold only what several families truly share: `unet` (UNet/CLIP LoRA widths and calls),
`stable_diffusion` (SD 1.x and 2.x), `tiny` (the tiny pipelines' tokenizer, text configs, VAE and scheduler).
"""
