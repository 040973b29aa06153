"""Full differences in a Wan LoRA file are applied, not refused: ComfyUI's `.diff` (a norm's, as lightx2v's I2V
speed LoRAs carry `cross_attn.norm_k_img.diff`; a Linear's), `.diff_b` (a norm's or a Linear's bias) and the
`.diff_m` of kijai's extractions (a block's or the head's modulation). On the tiny Wan 2.1 I2V pipeline a file with
all of them beside low-rank factors gives, on every frame, diffusers' own WanImageToVideoPipeline within 2 levels,
where diffusers loads and fuses the factors (load_lora_weights + fuse_lora) and the full differences are added to
its weights by hand at the LoRA's scale (ComfyUI's math, W += strength · diff, which diffusers' loader drops); each
difference's parameter is the one diffusers' own single-file converter names. The base is bit-exact after. On Wan
2.2 A14B each lands on both transformers, at `scale` and `scale_2`. What cannot apply is refused by name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from diffusers import WanImageToVideoPipeline
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

from engine.errors import IncompatibleLoraError
from engine.families.tiny_wan import build_tiny_i2v_pipeline
from engine.families.wan_i2v import FAMILY
from engine.formats.targets import TargetTable
from engine.requests import GenerateRequest, LoraSpec
from engine.weights.swap import ActiveAdapter, WeightPatcher
from lora_catalog import mark_unsupported, scan_local_dirs
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, local_engine, pixels
from tests.support.formats import load
from tests.support.image_inputs import example_image, input_image
from tests.support.images import assert_images_close, level_difference
from tests.support.wan import FRAMES, PROMPT, diffusers_frames, factors, lora_file

FILE, PLAIN = "wan_i2v_differences.safetensors", "wan_i2v_differences_plain.safetensors"
SCALE = 0.8
# Each full difference: the transformer's parameter in diffusers' names -> its name in the file (Wan's original
# names under ComfyUI's prefix; norm3 is diffusers' norm2), and the spread of its random values.
DIFFERENCES = {
    "blocks.0.attn2.norm_added_k.weight": ("blocks.0.cross_attn.norm_k_img.diff", 0.5),  # lightx2v's
    "blocks.1.attn1.norm_q.weight": ("blocks.1.self_attn.norm_q.diff", 0.5),
    "blocks.0.norm2.weight": ("blocks.0.norm3.diff", 0.5),
    "blocks.0.norm2.bias": ("blocks.0.norm3.diff_b", 0.3),
    "condition_embedder.image_embedder.norm1.weight": ("img_emb.proj.0.diff", 0.5),
    "blocks.0.scale_shift_table": ("blocks.0.diff_m", 0.3),  # kijai's
    "blocks.1.scale_shift_table": ("blocks.1.diff_m", 0.3),
    "scale_shift_table": ("head.diff_m", 0.3),
    "blocks.0.attn1.to_q.bias": ("blocks.0.self_attn.q.diff_b", 0.3),  # beside the layer's factors
    "blocks.1.ffn.net.0.proj.bias": ("blocks.1.ffn.0.diff_b", 0.3),  # a layer without factors
    "proj_out.bias": ("head.head.diff_b", 0.1),
    "blocks.0.attn1.to_k.weight": ("blocks.0.self_attn.k.diff", 0.05),  # beside the layer's factors
    "blocks.1.attn2.to_out.0.weight": ("blocks.1.cross_attn.o.diff", 0.05),
}
# The layers with low-rank factors (their image keys and values included).
MODULES = (
    "blocks.0.attn1.to_q",
    "blocks.0.attn1.to_k",
    "blocks.0.attn2.add_k_proj",
    "blocks.0.attn2.add_v_proj",
    "blocks.1.ffn.net.2",
)


def request(*loras: LoraSpec, **fields: object) -> GenerateRequest:
    values = {"prompt": PROMPT, "steps": 3, "width": 64, "height": 64, "seed": 7, "image": input_image()} | fields
    return GenerateRequest(loras=tuple(loras), **values)  # type: ignore[arg-type]


def differences_of(transformer: torch.nn.Module, seed: int = 5) -> dict[str, torch.Tensor]:
    """Random full differences for `DIFFERENCES`, shaped as the transformer's parameters."""
    generator = torch.Generator().manual_seed(seed)
    made = {}
    for name, (_, spread) in DIFFERENCES.items():
        shape = transformer.get_parameter(name).shape
        made[name] = torch.randn(shape, generator=generator) * spread
    return made


def original(name: str) -> str:
    """A difference's parameter in Wan's original names (`blocks.0.diff_m` -> `blocks.0.modulation`)."""
    file_name = DIFFERENCES[name][0]
    stem, _, suffix = file_name.rpartition(".")
    return f"{stem}.{ {'diff': 'weight', 'diff_b': 'bias', 'diff_m': 'modulation'}[suffix] }"


@pytest.fixture(scope="module")
def folder(loaded_wan_i2v, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wan-differences")
    transformer = loaded_wan_i2v.pipe.transformer
    plain = lora_file(factors(transformer, MODULES, seed=71), "comfy", 4.0)
    save_lora(folder / PLAIN, plain)
    differences = differences_of(transformer)
    save_lora(folder / FILE, plain | {f"diffusion_model.{DIFFERENCES[n][0]}": d for n, d in differences.items()})
    return folder


def test_each_difference_names_the_parameter_diffusers_single_file_converter_names():
    for name in DIFFERENCES:
        assert list(convert_wan_transformer_to_diffusers({original(name): torch.zeros(1)})) == [name], name


def test_norm_modulation_bias_and_linear_differences_give_diffusers_with_them_added_by_hand_on_every_frame(
    folder, loaded_wan_i2v, pristine_wan_i2v, tiny_wan_i2v_dir, base_settings
):
    pipe = loaded_wan_i2v.pipe
    differences = differences_of(pipe.transformer)
    settings = base_settings.replace(local_lora_dir=folder, base_model_id=loaded_wan_i2v.base_model_id)
    with local_engine(loaded_wan_i2v, settings, folder) as engine:
        plain = generate(engine, request(LoraSpec(f"local:{PLAIN}", scale=SCALE)))
        ours = generate(engine, request(LoraSpec(f"local:{FILE}", scale=SCALE)))
        # No warning of anything left out: the same as the file without its differences has (its unknown base).
        assert len(ours.warnings) == len(plain.warnings), ours.warnings
        # ComfyUI's math on every parameter only a difference changes: pristine + scale · diff.
        for name, difference in differences.items():
            if name.endswith(".weight") and name.removesuffix(".weight") in MODULES:
                continue  # that weight has factors too: the video checks it
            expected = torch.add(pristine_wan_i2v[f"transformer.{name}"], difference, alpha=SCALE)
            torch.testing.assert_close(pipe.transformer.get_parameter(name), expected, rtol=0, atol=1e-6, msg=name)
        engine.restore_base_weights()
        assert_components_pristine(pipe, pristine_wan_i2v, ("transformer", "text_encoder", "image_encoder", "vae"))
    theirs = diffusers_frames(
        tiny_wan_i2v_dir,
        folder,
        PLAIN,
        SCALE,
        pipeline_class=WanImageToVideoPipeline,
        image=example_image(),
        differences=differences,
    )
    assert level_difference(ours.frames[-1], plain.frames[-1]) > 2, "the differences must visibly change the video"
    assert len(ours.frames) == len(theirs) == FRAMES
    for index, (frame, expected) in enumerate(zip(ours.frames, theirs, strict=True)):
        assert_images_close(pixels(frame), pixels(expected), f"frame {index}")


def test_in_bfloat16_each_difference_is_rounded_once_into_its_parameter_and_restored_bit_exact(tmp_path):
    """A pool in bfloat16, its served dtype: ComfyUI's sum in float32 (its intermediate dtype), rounded once to the
    parameter's dtype; the exact swap writes nothing else and takes it all back bit for bit."""
    transformer = build_tiny_i2v_pipeline(0).transformer.to(torch.bfloat16)
    table = TargetTable(
        {"transformer": transformer},
        denoiser="transformer",
        convert_lora=FAMILY.convert_lora,
        full_differences=FAMILY.full_differences,
    )
    differences = differences_of(transformer)
    plain = lora_file(factors(transformer, MODULES, seed=71), "comfy", 4.0)
    tensors = plain | {f"diffusion_model.{DIFFERENCES[n][0]}": d for n, d in differences.items()}
    adapter = load(save_lora(tmp_path / FILE, {k: v.to(torch.bfloat16) for k, v in tensors.items()}), table)
    pristine = {name: p.detach().clone() for name, p in transformer.named_parameters()}
    patcher = WeightPatcher(table.params, torch.device("cpu"))
    patcher.apply([ActiveAdapter(adapter, SCALE)])
    for name, difference in differences.items():
        if name.removesuffix(".weight") in MODULES:
            continue  # that weight has factors too
        summed = torch.add(pristine[name].float(), difference.to(torch.bfloat16).float(), alpha=SCALE)
        assert torch.equal(transformer.get_parameter(name), summed.to(torch.bfloat16)), name
    patcher.restore_all()
    for name, param in transformer.named_parameters():
        assert torch.equal(param, pristine[name]), name


def test_differences_that_cannot_apply_are_refused_by_name_and_the_base_stays_exact(
    loaded_wan_i2v, pristine_wan_i2v, base_settings, tmp_path
):
    transformer = loaded_wan_i2v.pipe.transformer
    plain = lora_file(factors(transformer, MODULES[:2], seed=72), "comfy", 4.0)
    bad = {
        # A block the tiny transformer lacks (2 blocks).
        "missing": ("diffusion_model.blocks.7.norm3.diff", torch.ones(52), r"blocks\.7\.norm2\.weight, which the"),
        "shape": ("diffusion_model.blocks.0.norm3.diff", torch.ones(10), r"\(10,\) does not fit transformer\.blocks"),
        # musubi's naming, which never writes differences: no parameter is read from it.
        "naming": ("lora_unet_blocks_0_norm3.diff", torch.ones(52), r"names the served family does not place"),
    }
    for case, (name, tensor, _) in bad.items():
        save_lora(tmp_path / f"{case}.safetensors", plain | {name: tensor})
    settings = base_settings.replace(local_lora_dir=tmp_path, base_model_id=loaded_wan_i2v.base_model_id)
    with local_engine(loaded_wan_i2v, settings, tmp_path) as engine:
        for case, (name, _, message) in bad.items():
            with pytest.raises(IncompatibleLoraError, match=message) as caught:
                engine.check_lora(LoraSpec(f"local:{case}.safetensors"))
            assert caught.value.status == 400 and name in str(caught.value), (case, str(caught.value))
        engine.restore_base_weights()
    assert_components_pristine(loaded_wan_i2v.pipe, pristine_wan_i2v, ("transformer",))


def test_each_difference_lands_on_both_a14b_transformers_at_scale_and_scale_2(
    loaded_wan22, pristine_wan22, base_settings, tmp_path
):
    pipe = loaded_wan22.pipe
    made = {
        "blocks.0.norm2.weight": "blocks.0.norm3.diff",
        "blocks.1.scale_shift_table": "blocks.1.diff_m",
        "scale_shift_table": "head.diff_m",
        "blocks.0.attn1.to_v.bias": "blocks.0.self_attn.v.diff_b",
        "blocks.1.ffn.net.2.weight": "blocks.1.ffn.2.diff",
    }
    generator = torch.Generator().manual_seed(9)
    differences = {n: torch.randn(pipe.transformer.get_parameter(n).shape, generator=generator) * 0.2 for n in made}
    tensors = lora_file(factors(pipe.transformer, ("blocks.0.attn1.to_q",), seed=73), "comfy", 4.0)
    save_lora(tmp_path / FILE, tensors | {f"diffusion_model.{made[n]}": d for n, d in differences.items()})
    settings = base_settings.replace(local_lora_dir=tmp_path, base_model_id=loaded_wan22.base_model_id)
    with local_engine(loaded_wan22, settings, tmp_path) as engine:
        generate(
            engine,
            GenerateRequest(
                prompt=PROMPT,
                loras=(LoraSpec(f"local:{FILE}", scale=0.8, scale_2=0.6),),
                steps=1,
                width=64,
                height=64,
                num_frames=FRAMES,
            ),
        )
        for component, scale in (("transformer", 0.8), ("transformer_2", 0.6)):
            for name, difference in differences.items():
                expected = torch.add(pristine_wan22[f"{component}.{name}"], difference, alpha=scale)
                actual = getattr(pipe, component).get_parameter(name)
                torch.testing.assert_close(actual, expected, rtol=0, atol=1e-6, msg=f"{component}.{name}")
        engine.restore_base_weights()
    assert_components_pristine(pipe, pristine_wan22, ("transformer", "transformer_2"))


def test_the_catalogue_marks_full_differences_unsupported_only_where_the_family_does_not_apply_them(folder):
    entry = {e.weight_name: e for e in scan_local_dirs([folder]).entries}[FILE]
    assert entry.family is Family.WAN_I2V and entry.unsupported is None
    names = [f"diffusion_model.{name}" for name, _ in DIFFERENCES.values()]
    for family in (Family.WAN, Family.WAN22, Family.WAN22_I2V):
        assert mark_unsupported(dataclasses.replace(entry, family=family), names).unsupported is None, family
    # Elsewhere refused as before, a modulation difference alone too (diffusers' converters drop it silently).
    modulation = [name for name in names if name.endswith(".diff_m")]
    for family in (Family.FLUX, Family.SDXL, Family.UNKNOWN):
        for given in (names, modulation):
            marked = mark_unsupported(dataclasses.replace(entry, family=family), given)
            assert marked.unsupported == "full weight differences", (family, given)
