"""Checkpoints of served families (FLUX.1 Krea [dev], Qwen-Image-2512, Z-Image base): each a base of its family
declared by its difference (`Base.checkpoint`), with its own defaults; LoRAs for its sibling routed by card,
metadata and tensors (which cannot tell siblings apart) and run with a note; a sibling's LoRA on a tiny pool; four
clients with different LoRAs on one checkpoint's pool each get exactly their own image, its base bit-exact after."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from engine.families.origin import check_origin, judge_origin
from engine.families.registry import family_spec
from engine.models import parse_models
from engine.pipeline.loading import load_pipeline
from engine.pools.routing import pick_pool
from engine.requests import GenerateRequest, LoraSpec
from families import IDENTITIES, base_of, siblings
from families.chroma import BASE_ID as CHROMA_BASE
from families.chroma import FLASH_ID as CHROMA_FLASH
from families.chroma import MODEL_ID as CHROMA_HD
from families.flux import KREA_ID
from families.flux import MODEL_ID as FLUX_DEV
from families.krea2 import MODEL_ID as KREA2_TURBO
from families.krea2 import RAW_ID as KREA2_RAW
from families.qwen_image import MODEL_ID as QWEN_IMAGE
from families.qwen_image import MODEL_ID_2512
from families.zimage import BASE_ID as ZIMAGE_BASE
from families.zimage import MODEL_ID as ZIMAGE_TURBO
from lora_catalog.bases import KNOWN_BASES, base_from_metadata, family_of_base
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from tests.engine.families.test_origin import lora_for
from tests.support import qwen_image, zimage
from tests.support.checks import generate
from tests.support.dit import (
    assert_components_pristine,
    hub_pools,
    local_engine,
    pixels,
    pool_of,
    pool_request,
    served_pools,
)
from tests.support.flux import CASES as FLUX_CASES
from tests.support.flux import write_flux_loras
from tests.support.image_inputs import PROMPT
from tests.support.images import assert_images_close
from tests.support.mixed import assert_mixed_clients_get_their_own_images
from tests.support.zimage import factors, lora_file

# (family, the sibling the checkpoint is of, the checkpoint, metadata naming the sibling, metadata naming it)
CASES = [
    (Family.FLUX, FLUX_DEV, KREA_ID, None, {"ss_sd_model_name": "flux1-krea-dev.safetensors"}),
    (
        Family.QWEN_IMAGE,
        QWEN_IMAGE,
        MODEL_ID_2512,
        None,
        {"modelspec.architecture": "qwen-image-2512/lora"},
    ),
    (
        Family.ZIMAGE,
        ZIMAGE_TURBO,
        ZIMAGE_BASE,
        {"ss_sd_model_name": "z_image_turbo_bf16.safetensors"},
        {"modelspec.architecture": "z-image-base/lora"},
    ),
    (
        Family.KREA2,
        KREA2_TURBO,
        KREA2_RAW,
        {"ss_sd_model_name": "krea2_turbo_bf16.safetensors"},
        {"modelspec.architecture": "krea-2-raw/lora"},
    ),
]
# Chroma1-Base and -Flash, checkpoints of Chroma1-HD (its own family: tests/engine/families/test_chroma.py).
CASES += [
    (
        Family.CHROMA,
        CHROMA_HD,
        CHROMA_BASE,
        {"ss_sd_model_name": "chroma1-hd.safetensors"},
        {"modelspec.architecture": "chroma1-base/lora"},
    ),
    (Family.CHROMA, CHROMA_HD, CHROMA_FLASH, None, {"ss_sd_model_name": "Chroma1-Flash.safetensors"}),
]
IDS = ["krea", "qwen-2512", "zimage-base", "krea2-raw", "chroma-base", "chroma-flash"]


def test_each_checkpoint_is_its_siblings_base_by_difference_with_its_own_defaults():
    krea, qwen, zimage = base_of(KREA_ID), base_of(MODEL_ID_2512), base_of(ZIMAGE_BASE)
    assert krea is not None and qwen is not None and zimage is not None
    assert (krea.checkpoint_of, krea.steps, krea.guidance) == (FLUX_DEV, None, 4.5)
    assert (qwen.checkpoint_of, qwen.steps, qwen.guidance) == (QWEN_IMAGE, None, None)
    assert (zimage.checkpoint_of, zimage.steps, zimage.guidance) == (ZIMAGE_TURBO, 50, 4.0)
    # The reference models stay the families' first bases; every checkpoint is listed in the base filter.
    assert [IDENTITIES[f].model_id for f in (Family.FLUX, Family.QWEN_IMAGE, Family.ZIMAGE)] == [
        FLUX_DEV,
        QWEN_IMAGE,
        ZIMAGE_TURBO,
    ]
    listed = {b.repo_id: b.family for b in KNOWN_BASES}
    assert (listed[KREA_ID], listed[MODEL_ID_2512], listed[ZIMAGE_BASE]) == (
        Family.FLUX,
        Family.QWEN_IMAGE,
        Family.ZIMAGE,
    )
    assert siblings(FLUX_DEV, KREA_ID) and siblings(ZIMAGE_TURBO, ZIMAGE_BASE) and siblings(MODEL_ID_2512, QWEN_IMAGE)
    # schnell is no checkpoint of [dev]'s: its card says nothing of Krea's LoRAs.
    assert not siblings("black-forest-labs/FLUX.1-schnell", KREA_ID) and not siblings(FLUX_DEV, FLUX_DEV)


@pytest.mark.parametrize(("family", "sibling", "checkpoint", "_", "__"), CASES, ids=IDS)
def test_models_names_each_checkpoint_as_its_own_pool_of_its_family(family, sibling, checkpoint, _, __):
    pools = parse_models(f"{checkpoint}:fp8,{sibling}")
    assert [(p.model_id, p.base_model_id, p.quantize) for p in pools] == [
        (checkpoint, checkpoint, "fp8"),
        (sibling, sibling, None),
    ]
    assert family_of_base(checkpoint) is family and family_spec(checkpoint).family is family
    tiny = parse_models(f"{IDENTITIES[family].tiny_id}={checkpoint}")
    assert tiny[0].is_tiny and tiny[0].base_model_id == checkpoint


@pytest.fixture(scope="module")
def pools_of(tiny_pipes):
    """`pools_of(family, *bases)`: pools of those bases of the family, at the tiny pipeline's widths."""
    served = {p.family: p for p in served_pools(tiny_pipes)}
    return lambda family, *bases: [dataclasses.replace(served[family], base_model_id=b) for b in bases]


@pytest.mark.parametrize(("family", "sibling", "checkpoint", "sibling_metadata", "metadata"), CASES, ids=IDS)
def test_a_card_routes_to_its_own_checkpoint_else_to_the_sibling_with_a_note(
    pools_of, family, sibling, checkpoint, sibling_metadata, metadata
):
    both = pools_of(family, sibling, checkpoint)
    for made_for, runs_on in ((sibling, checkpoint), (checkpoint, sibling)):
        origin = judge_origin([made_for], lambda: pytest.fail("the card decides"))
        assert both[pick_pool("LoRA 'x'", origin, both)].base_model_id == made_for
        assert check_origin("LoRA 'x'", origin, made_for) is None
        # Only the other checkpoint served: it runs there, with a note naming both.
        alone = pools_of(family, runs_on)
        assert pick_pool("LoRA 'x'", origin, alone) == 0
        note = check_origin("LoRA 'x'", origin, runs_on)
        assert note is not None and f"made for {base_of(made_for).display_name} ({made_for})" in note  # type: ignore[union-attr]
        assert f"runs on {base_of(runs_on).display_name} ({runs_on})" in note  # type: ignore[union-attr]


@pytest.mark.parametrize(("family", "sibling", "checkpoint", "sibling_metadata", "metadata"), CASES, ids=IDS)
def test_metadata_naming_a_checkpoint_routes_to_it_and_naming_only_the_family_to_the_first(
    pools_of, family, sibling, checkpoint, sibling_metadata, metadata
):
    both = pools_of(family, sibling, checkpoint)
    named = judge_origin([], lambda: (metadata, {}))
    assert (named.how, named.families, named.bases) == ("metadata", (family,), (checkpoint,))
    assert both[pick_pool("LoRA 'x'", named, both)].base_model_id == checkpoint
    note = check_origin("LoRA 'x'", named, sibling)
    assert note is not None and f"made for {base_of(checkpoint).display_name}" in note  # type: ignore[union-attr]
    if sibling_metadata is not None:
        assert base_from_metadata(sibling_metadata, family) == sibling
    # Metadata naming the family only: the first pool of it; a note on the checkpoint, none on the reference.
    version = {
        Family.FLUX: "flux1",
        Family.QWEN_IMAGE: "qwen_image",
        Family.ZIMAGE: "zimage",
        Family.CHROMA: "chroma",
        Family.KREA2: "krea2",
    }
    version = version[family]
    plain = judge_origin([], lambda: ({"ss_base_model_version": version}, {}))
    assert plain.bases == () and both[pick_pool("LoRA 'x'", plain, both)].base_model_id == sibling
    assert check_origin("LoRA 'x'", plain, sibling) is None
    note = check_origin("LoRA 'x'", plain, checkpoint)
    assert note is not None and "its metadata cannot tell" in note


@pytest.mark.parametrize(("family", "sibling", "checkpoint", "_", "__"), CASES, ids=IDS)
def test_tensors_alone_cannot_tell_siblings_apart_they_run_on_the_served_one_with_the_note(
    tiny_pipes, pools_of, family, sibling, checkpoint, _, __
):
    origin = judge_origin([], lambda: ({}, lora_for(tiny_pipes[family], family, "peft")))
    assert origin.how == "shapes" and origin.families == (family,)
    for served in (checkpoint, sibling):
        pools = pools_of(family, served)
        assert pick_pool("LoRA 'x'", origin, pools) == 0
        warning = check_origin("LoRA 'x'", origin, served)
        assert warning is not None and "judged by its tensors alone" in warning
        assert "its tensors cannot tell" in warning and f"runs on {base_of(served).display_name}" in warning  # type: ignore[union-attr]


def test_civitais_qwen_group_is_told_apart_by_the_files_metadata():
    # Civitai's label decides the family; a 2512 file's metadata names its checkpoint.
    named = judge_origin(
        [QWEN_IMAGE], lambda: ({"modelspec.architecture": "qwen-image-2512"}, {}), declared_family=Family.QWEN_IMAGE
    )
    assert named.bases == (MODEL_ID_2512,) and named.how == "card"
    plain = judge_origin([QWEN_IMAGE], lambda: ({}, {}), declared_family=Family.QWEN_IMAGE)
    assert plain.bases == (QWEN_IMAGE,)
    # Groups of one checkpoint never read the file.
    krea = judge_origin([KREA_ID], lambda: pytest.fail("not read"), declared_family=Family.FLUX)
    assert krea.bases == (KREA_ID,)


# -- a sibling's LoRA on a tiny pool --------------------------------------------------------------------------


def test_a_turbo_lora_runs_on_a_z_image_base_pool_with_a_note_as_on_turbos(
    tiny_models, base_settings, loaded_zimage, tmp_path: Path
):
    """A tiny pool of the Z-Image base is the same tiny pipeline: its defaults are the base's card's (guidance 4.0), and
    a LoRA whose metadata names Turbo runs on it as on Turbo's pool, with a note naming both."""
    made = factors(loaded_zimage.pipe.transformer, rank=2, seed=5)
    save_lora(
        tmp_path / "turbo.safetensors", lora_file(made, "peft", None), {"ss_sd_model_name": "z_image_turbo.safetensors"}
    )
    request = GenerateRequest(
        prompt=PROMPT,
        loras=(LoraSpec("local:turbo.safetensors", scale=0.8),),
        steps=2,
        guidance=0.0,
        width=64,
        height=64,
        seed=7,
    )
    settings = base_settings.replace(local_lora_dir=tmp_path)
    with local_engine(loaded_zimage, settings.replace(base_model_id=ZIMAGE_TURBO), tmp_path) as turbo:
        assert turbo.defaults.guidance == 0.0
        on_turbo = generate(turbo, request)
    assert not any("made for" in w for w in on_turbo.warnings)
    folder = tiny_models.folder(Family.ZIMAGE)
    base = load_pipeline(settings.replace(model_id=str(folder), base_model_id=ZIMAGE_BASE))
    with local_engine(base, settings.replace(base_model_id=ZIMAGE_BASE), tmp_path) as engine:
        assert (engine.base_model_id, engine.defaults.guidance, engine.defaults.guidance_kind) == (
            ZIMAGE_BASE,
            4.0,
            "cfg",
        )
        result = generate(engine, request)
    assert any(
        f"made for Z-Image Turbo ({ZIMAGE_TURBO}); it runs on Z-Image ({ZIMAGE_BASE})" in w for w in result.warnings
    )
    assert_images_close(pixels(result.image), pixels(on_turbo.image))


# -- four clients on one checkpoint's pool ----------------------------------------------------------------------

# (family, the checkpoint, the writer of its sibling's LoRA files, four cases in different namings)
POOL_CASES = [
    (Family.FLUX, KREA_ID, write_flux_loras, FLUX_CASES, ("peft", "kohya", "comfy", "xlabs")),
    (
        Family.QWEN_IMAGE,
        MODEL_ID_2512,
        qwen_image.write_qwen_loras,
        qwen_image.CASES,
        ("peft", "comfy", "kohya", "bare"),
    ),
    (Family.ZIMAGE, ZIMAGE_BASE, zimage.write_zimage_loras, zimage.CASES, ("peft", "comfy", "kohya", "dotted")),
]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("family", "checkpoint", "write", "cases", "names"), POOL_CASES, ids=IDS[:3])
def test_four_clients_with_different_loras_on_a_checkpoints_pool_get_exactly_their_own_images(
    tiny_models, base_settings, clean_hub, tmp_path: Path, family, checkpoint, write, cases, names
):
    """The checkpoint served as its own pool (the sibling's tiny weights loaded under the checkpoint's id): its
    sibling's LoRAs in four namings, from four clients at once, each give the image they give alone (each its own,
    none the base's); after, every weight and the base image are bit-exact."""
    settings = base_settings.replace(model_id=str(tiny_models.folder(family)), base_model_id=checkpoint)
    loaded = load_pipeline(settings)
    pipe = loaded.pipe
    modules = [n for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)]
    pristine = {f"{n}.{k}": v.detach().clone() for n in modules for k, v in getattr(pipe, n).state_dict().items()}
    chosen = [c for c in cases if c.name in names]
    write(pipe, tmp_path, cases=chosen)
    refs = [f"local:{c.file_name}" for c in chosen]
    with hub_pools([(loaded, checkpoint)], settings, clean_hub.url, tmp_path) as pools:
        assert all(pool_of(pools, ref) == checkpoint for ref in refs)
        base = generate(pools, pool_request()).image.tobytes()
        spec = [(LoraSpec(ref, scale=0.6 + 0.1 * i), i) for i, ref in enumerate(refs * 2)]
        work = [(pool_request(lora, seed=seed), checkpoint) for lora, seed in spec]
        images = assert_mixed_clients_get_their_own_images(pools, work, clients=4)
        assert base not in images and len(set(images)) == len(images)
        assert generate(pools, pool_request()).image.tobytes() == base
    assert_components_pristine(pipe, pristine, modules)
