"""The memory plan's answers for the README's hardware table: each served combination on each GPU a Space runs
on, with the host RAM of the Space that carries it, under the default settings (`QUANTIZE=auto`).

    python -m bench.plan_table

Arithmetic only (the families' declared sizes through `engine.pools.plan`): nothing is loaded, no GPU is used.
Each line: the pools, the GPU and its Space's RAM, then the plan (`MemoryPlan.describe`) or its refusal.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/plan_table.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from engine.errors import SettingsError
from engine.hostmem import default_host_budget
from engine.models import parse_models
from engine.pools.plan import GPUS, PlanOptions, declared_needs, plan_memory
from engine.settings import DEFAULT_MODEL_ID, Settings
from families.chroma import MODEL_ID as CHROMA_MODEL_ID
from families.flux import MODEL_ID as FLUX_MODEL_ID
from families.flux2_dev import MODEL_ID as FLUX2_DEV_MODEL_ID
from families.krea2 import MODEL_ID as KREA2_MODEL_ID
from families.ltx2 import MODEL_ID as LTX2_MODEL_ID
from families.qwen_image import MODEL_ID as QWEN_MODEL_ID
from families.sd15 import MODEL_ID as SD15_MODEL_ID
from families.wan import MODEL_ID as WAN_1_3B_MODEL_ID
from families.wan import MODEL_ID_5B as WAN_5B_MODEL_ID
from families.wan import MODEL_ID_14B as WAN_14B_MODEL_ID
from families.wan22 import MODEL_ID as WAN_A14B_MODEL_ID
from families.wan22_i2v import MODEL_ID as WAN_I2V_A14B_MODEL_ID
from families.zimage import MODEL_ID as ZIMAGE_MODEL_ID

_GB, _MIB = 10**9, 2**20
# Each GPU with the memory torch reports for it (the tests' figures; the A100's the plan's `GPUS` figure) and the
# Space hardware carrying it with its host RAM (Hugging Face's hardware list; the A10G's `a10g-large` rather than
# its 15 GB `a10g-small`, which T5 or Qwen3 in host RAM outgrow).
SPACES = (
    ("T4", 15_095 * _MIB, "t4-small", 15 * _GB),
    ("A10G", 23_028 * _MIB, "a10g-large", 46 * _GB),
    ("L4", 23_034 * _MIB, "l4x1", 30 * _GB),
    ("L40S", 46_068 * _MIB, "l40sx1", 62 * _GB),
    ("A100 or H100", GPUS[-1][1], "a100-large", 142 * _GB),
)
COMBINATIONS = {
    "SDXL alone": (DEFAULT_MODEL_ID,),
    "SDXL and SD 1.5": (DEFAULT_MODEL_ID, SD15_MODEL_ID),
    "FLUX.1 [dev] alone": (FLUX_MODEL_ID,),
    "FLUX.1 beside SDXL": (FLUX_MODEL_ID, DEFAULT_MODEL_ID),
    "FLUX.1 beside SDXL and SD 1.5": (FLUX_MODEL_ID, DEFAULT_MODEL_ID, SD15_MODEL_ID),
    "Z-Image Turbo alone": (ZIMAGE_MODEL_ID,),
    "Z-Image Turbo beside SDXL": (ZIMAGE_MODEL_ID, DEFAULT_MODEL_ID),
    "FLUX.2 [dev] alone": (FLUX2_DEV_MODEL_ID,),
    "FLUX.2 [dev] beside SDXL": (FLUX2_DEV_MODEL_ID, DEFAULT_MODEL_ID),
    "Chroma1-HD alone": (CHROMA_MODEL_ID,),
    "Krea 2 Turbo alone": (KREA2_MODEL_ID,),
    "Wan 2.1 T2V 1.3B alone": (WAN_1_3B_MODEL_ID,),
    "Wan 2.2 TI2V-5B alone": (WAN_5B_MODEL_ID,),
    "Wan 2.1 T2V 14B alone": (WAN_14B_MODEL_ID,),
    "Wan 2.2 T2V-A14B alone": (WAN_A14B_MODEL_ID,),
    "Wan 2.2 I2V-A14B alone": (WAN_I2V_A14B_MODEL_ID,),
    "LTX-2 19B alone": (LTX2_MODEL_ID,),
}
# A Q4_K GGUF file of Chroma1-HD as a `MODELS` item (the repo and file names are illustrative: the plan reads only
# the quant type in the name; nothing is downloaded).
CHROMA_Q4_K = f"{CHROMA_MODEL_ID}@silveroxides/Chroma1-HD-GGUF/Chroma1-HD-Q4_K_M.gguf"
# Krea 2 Turbo's likewise (illustrative names, as test_plan_krea2's).
KREA2_Q4_K = f"{KREA2_MODEL_ID}@someone/Krea-2-Turbo-GGUF/krea-2-turbo-Q4_K_M.gguf"
# LTX-2 19B's transformer in GGUF files of two types (illustrative names, as test_plan_ltx2's).
LTX2_Q4_K = f"{LTX2_MODEL_ID}@someone/LTX-2-GGUF/ltx-2-19b-Q4_K_M.gguf"
LTX2_Q8_0 = f"{LTX2_MODEL_ID}@someone/LTX-2-GGUF/ltx-2-19b-Q8_0.gguf"
# Rows under other settings than the defaults: (label, pools, settings changed).
SETTINGS_ROWS: tuple[tuple[str, tuple[str, ...], dict[str, object]], ...] = (
    ("Chroma1-HD, QUANTIZE=fp8", (CHROMA_MODEL_ID,), {"quantize": "fp8"}),
    ("Chroma1-HD, QUANTIZE=int4", (CHROMA_MODEL_ID,), {"quantize": "int4"}),
    ("Chroma1-HD in GGUF Q4_K", (CHROMA_Q4_K,), {}),
    ("Krea 2 Turbo, QUANTIZE=fp8", (KREA2_MODEL_ID,), {"quantize": "fp8"}),
    ("Krea 2 Turbo, QUANTIZE=int4", (KREA2_MODEL_ID,), {"quantize": "int4"}),
    ("Krea 2 Turbo in GGUF Q4_K", (KREA2_Q4_K,), {}),
    ("Wan 2.1 T2V 1.3B, HOST_CACHE_BYTES=256MiB", (WAN_1_3B_MODEL_ID,), {"host_cache_bytes": 256 * _MIB}),
    ("Wan 2.1 T2V 14B, QUANTIZE=fp8", (WAN_14B_MODEL_ID,), {"quantize": "fp8"}),
    ("Wan 2.2 T2V-A14B, QUANTIZE=fp8", (WAN_A14B_MODEL_ID,), {"quantize": "fp8"}),
    ("Wan 2.2 I2V-A14B, QUANTIZE=fp8", (WAN_I2V_A14B_MODEL_ID,), {"quantize": "fp8"}),
    # Both of A14B's transformers stored in int4 (`FamilySpec.stored`).
    ("Wan 2.2 T2V-A14B, QUANTIZE=int4", (WAN_A14B_MODEL_ID,), {"quantize": "int4"}),
    ("LTX-2 19B, QUANTIZE=fp8", (LTX2_MODEL_ID,), {"quantize": "fp8"}),
    ("LTX-2 19B in GGUF Q4_K", (LTX2_Q4_K,), {}),
    ("LTX-2 19B in GGUF Q8_0", (LTX2_Q8_0,), {}),
)


# Self-hosted GPUs of 12 to 24 GB (issue 43), with the memory torch reports (nvidia-smi's total: an RTX 3060 12 GB
# 12,288 MiB, a 4070 12,282, a 4060 Ti 16 GB 16,380, a 4090 24,564; a T4 is the Spaces row's) and a desktop's
# 32 GB of RAM.
CONSUMER = (
    ("RTX 3060 / 4070 (12 GB)", 12_282 * _MIB, "desktop", 32 * _GB),
    ("RTX 4060 Ti (16 GB)", 16_380 * _MIB, "desktop", 32 * _GB),
    ("RTX 3090 / 4090 (24 GB)", 24_564 * _MIB, "desktop", 32 * _GB),
    ("T4 (16 GB)", 15_095 * _MIB, "t4-small", 15 * _GB),
)
# city96's and QuantStack's published GGUF files, named as `MODELS` items (the plan reads the type in the name:
# nothing is downloaded).
FLUX_Q4_K = f"{FLUX_MODEL_ID}@city96/FLUX.1-dev-gguf/flux1-dev-Q4_K_S.gguf"
QWEN_Q4_K = f"{QWEN_MODEL_ID}@QuantStack/Qwen-Image-GGUF/Qwen_Image-Q4_K_M.gguf"
ZIMAGE_Q4_K = f"{ZIMAGE_MODEL_ID}@jayn7/Z-Image-Turbo-GGUF/z_image_turbo-Q4_K_M.gguf"
_SMALL_INT4 = {"quantize": "int4", "lora_max_rank": 32, "device_cache_bytes": 256 * _MIB}
_SMALL_Q4_K = {"lora_max_rank": 16, "device_cache_bytes": 256 * _MIB}
_SMALL_QWEN = {"quantize": "int4", "lora_max_rank": 16, "device_cache_bytes": 512 * _MIB}
# The 12-16 GB rows: (label, MODELS items, settings changed).
CONSUMER_ROWS: tuple[tuple[str, tuple[str, ...], dict[str, object]], ...] = (
    ("FLUX.1 [dev] in GGUF Q4_K", (FLUX_Q4_K,), {}),
    ("FLUX.1 [dev], QUANTIZE=int4", (FLUX_MODEL_ID,), {"quantize": "int4"}),
    ("FLUX.1 [dev], QUANTIZE=auto", (FLUX_MODEL_ID,), {}),
    ("Z-Image Turbo, QUANTIZE=auto", (ZIMAGE_MODEL_ID,), {}),
    ("Z-Image Turbo in GGUF Q4_K", (ZIMAGE_Q4_K,), {}),
    ("Qwen-Image in GGUF Q4_K", (QWEN_Q4_K,), {}),
    ("Qwen-Image, QUANTIZE=int4", (QWEN_MODEL_ID,), {"quantize": "int4"}),
    # LTX-2 on 24 GB: refused in every storage (the card's clip's working memory beside the weights).
    ("LTX-2 19B in GGUF Q4_K", (LTX2_Q4_K,), {}),
    ("LTX-2 19B, QUANTIZE=int4", (LTX2_MODEL_ID,), {"quantize": "int4"}),
    # What the 12 GB refusals name: smaller LoRA branch buffers and adapter cache.
    ("FLUX.1 [dev], QUANTIZE=int4, LORA_MAX_RANK=32, DEVICE_CACHE_BYTES=256MiB", (FLUX_MODEL_ID,), _SMALL_INT4),
    ("FLUX.1 [dev] in GGUF Q4_K, LORA_MAX_RANK=16, DEVICE_CACHE_BYTES=256MiB", (FLUX_Q4_K,), _SMALL_Q4_K),
    ("Qwen-Image, QUANTIZE=int4, LORA_MAX_RANK=16, DEVICE_CACHE_BYTES=512MiB", (QWEN_MODEL_ID,), _SMALL_QWEN),
)


def answer(models: tuple[str, ...], total: int, ram: int, **changes: object) -> str:
    """The plan for `models` (`MODELS` items) on a GPU of `total` bytes with `ram` bytes of host RAM, or its
    refusal."""
    pools = parse_models(",".join(models))
    settings = Settings(device="cpu", pools=pools).replace(host_ram_bytes=default_host_budget(ram), **changes)
    # DTYPE=auto as on a GPU (each family's half precision); nothing touches CUDA.
    needs = declared_needs(settings, torch.device("cuda"))
    assert needs is not None, "every combination here has declared sizes"
    try:
        return plan_memory(needs, total, PlanOptions.of(settings)).describe()
    except SettingsError as e:
        return f"refused: {e}"


def main() -> None:
    for label, models in COMBINATIONS.items():
        for gpu, total, space, ram in SPACES:
            print(f"{label} | {gpu}, {space} ({ram // _GB} GB RAM) | {answer(models, total, ram)}")
    for label, models, changes in SETTINGS_ROWS:
        for gpu, total, space, ram in SPACES:
            print(f"{label} | {gpu}, {space} ({ram // _GB} GB RAM) | {answer(models, total, ram, **changes)}")
    for label, models, changes in CONSUMER_ROWS:
        for gpu, total, where, ram in CONSUMER:
            print(f"{label} | {gpu}, {where} ({ram // _GB} GB RAM) | {answer(models, total, ram, **changes)}")


if __name__ == "__main__":
    main()
