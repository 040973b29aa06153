"""Caches: prepared adapters in host and device memory (`store`), LoRA files on disk (`disk`), and the ZeroGPU
worker's own adapters (`worker`); all of them in memory are bounded by one LRU (`lru`)."""
