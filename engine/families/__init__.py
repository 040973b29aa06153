"""Base-model families: one module each (`sdxl`, `sd15`, `sd2`, `flux`, `zimage`, `flux2`, `qwen_image`,
`flux_kontext`, `flux2_dev`, `qwen_image_edit`, the Wan families, `chroma`) declaring what it needs.

`spec` holds the shape a family fills in (`FamilySpec`, which holds the family's torch-free identity from the
top-level `families` package) and the width helpers every DiT family reads with; `registry` finds a family's spec by
base repo id or by `families.Family`; `origin` judges a LoRA's family (the claims' ranking: `families.claims`).
Shared helpers hold only what several families truly share: `unet` (UNet/CLIP LoRA widths and calls),
`stable_diffusion` (SD 1.x and 2.x), `tiny` (the tiny pipelines' tokenizer, text configs, VAE and scheduler),
`bfl_blocks` (the MLP width ratios that tell FLUX.1's LoRAs from FLUX.2's), `bfl_parts` (FLUX.1's VAE and its
previews, which Z-Image and Chroma reuse, and BFL's megapixel buckets), `bfl_lora` (diffusers' FLUX converter at
any served width, which FLUX.1's and Chroma's LoRAs go through); `flux2_tiny`
builds the tiny klein, `flux2_dev_tiny` the tiny FLUX.2 [dev] and `tiny_qwen_image` the tiny Qwen-Image, whose
parts the tiny Qwen-Image-Edit shares (kept apart from their family modules to keep each small).
"""
