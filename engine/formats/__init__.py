"""LoRA file formats: names converted with diffusers, factors matched to weights, per-layer updates (plain LoRA,
LoHa, LoKr, Tucker LoCon, DoRA) and pivotal-tuning embeddings; nothing here changes a served weight."""
