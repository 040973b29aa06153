"""A request with an image runs on the family's image-to-image or inpainting pipeline, built from the pool's own
components for that run.

`mode_pipeline` makes `Cls(**components, **config)` as diffusers' `from_pipe` does (the same modules, the pool's
pipeline config where the class takes it), but without `from_pipe`'s final `.to(dtype)`, which would cast the
pool's shared modules in place (a float32 VAE kept in a float16 pool, host-RAM encoders). Every model is the pool's
own object: no weight is loaded or copied, and the exact swap already fused into them is what the run sees. The
scheduler is a copy of the pool's (an image run sets its begin index and timesteps on its own), so a text-to-image
request after it sees the pool's scheduler as it was. An editing pool (FLUX.1 Kontext) runs its own pipeline.

`image_arguments` are the call's image inputs: the image as checked (a canvas at the checked width x height: the
input's own size rounded to the side multiple, or the client's target size; on a pool that reads it as a
reference, FLUX.2's and Qwen-Image-Edit-2509/2511's, at its own size and aspect, which the pipeline sizes itself),
then any further references as they came (a list, as diffusers' reference-editing pipelines take them), the
canvas and mask at the checked size for inpainting, the strength;
only those the class's call takes (FLUX.1 Kontext takes no strength), and the family's text-to-image arguments
likewise (SDXL's img2img call takes no width and height: its output is the image's size).
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
from PIL import Image

from engine.families.spec import FamilySpec, PipelineClass
from engine.images import InputImage
from engine.requests import CheckedRequest, RequestMode

__all__ = ["call_parameters", "default_strength", "image_arguments", "mode_class", "mode_pipeline", "served_modes"]

Pipeline = Any


def mode_class(family: FamilySpec, mode: RequestMode) -> PipelineClass | None:
    """The diffusers class `family` runs `mode` with (None: it has none)."""
    if mode == "text-to-image":
        return None if family.needs_image else family.pipeline_class
    if mode == "image-to-image":
        return family.pipeline_class if family.needs_image else family.image_to_image
    return family.inpainting


def served_modes(family: FamilySpec) -> tuple[RequestMode, ...]:
    modes: tuple[RequestMode, ...] = ("text-to-image", "image-to-image", "inpainting")
    return tuple(mode for mode in modes if mode_class(family, mode) is not None)


def default_strength(cls: PipelineClass | None) -> float | None:
    """diffusers' own default `strength` of the class's call (None: no class, or its call takes none)."""
    if cls is None:
        return None
    parameter = call_parameters(cls).get("strength")
    return None if parameter is None else float(parameter.default)


def call_parameters(cls: Any) -> dict[str, inspect.Parameter]:
    """The parameters of the class's call (a pipeline's inputs)."""
    return dict(inspect.signature(cls.__call__).parameters)


def mode_pipeline(pipe: Pipeline, request: CheckedRequest, family: FamilySpec) -> Pipeline:
    """The pipeline `request` runs on: the pool's own for its own mode, else the mode's class over its
    components (see the module docstring)."""
    # A reference video (an IC-LoRA's) runs on the family's in-context class (normalise refused it elsewhere).
    cls = family.in_context if request.reference_video is not None else mode_class(family, request.mode)
    # The pool's own pipeline is an instance of its class or of a subclass (the cluster's stand-in GPU's).
    if cls is None or cls in type(pipe).__mro__:
        return pipe
    expected, optional = _signature_keys(cls)
    components = {name: module for name, module in pipe.components.items() if name in expected}
    components["scheduler"] = copy.deepcopy(pipe.scheduler)
    if components.get("vae") is not None:
        components["vae"] = _fixed_dtype(components["vae"])
    for name in expected - set(components):
        # Optional components the pool's class does not have (SDXL img2img's image encoder): none, as from_pipe.
        components[name] = None
    config = {key: pipe.config[key] for key in optional if key in pipe.config}
    factory: Any = cls  # a diffusers pipeline class (PipelineClass names only what loading calls)
    built = factory(**components, **config)
    built.set_progress_bar_config(disable=True)
    return built


def _fixed_dtype(vae: Any) -> Any:
    """A view of the pool's VAE (the same parameters and submodules) that its pipeline cannot cast.

    SDXL's img2img and inpainting pipelines cast a `force_upcast` VAE to float32 around the encode and back to the
    run's dtype after it (and around the decode): on the pool's VAE, which loading keeps in float32 in a float16
    pool, that would round its weights to float16 for every later run, and any cast re-points its parameters out
    of the pool's flat buffer (`engine.pools.flat`). The view's dtype-only casts do nothing, and its encode takes
    its input in the VAE's own dtype (what the upcast gave diffusers where the VAE is already float32)."""
    view = copy.copy(vae)

    def to(*args: Any, **kwargs: Any) -> Any:
        if all(isinstance(a, torch.dtype) for a in (*args, *kwargs.values())) and set(kwargs) <= {"dtype"}:
            return view
        return vae.to(*args, **kwargs)

    def encode(x: Any, *args: Any, **kwargs: Any) -> Any:
        return type(vae).encode(view, x.to(vae.dtype), *args, **kwargs)

    # Instance attributes: nn.Module keeps plain callables in the instance's own __dict__ (this view's only).
    view.to = to
    view.encode = encode
    return view


def _signature_keys(cls: Any) -> tuple[set[str], set[str]]:
    expected, optional = cls._get_signature_keys(cls)
    return set(expected), set(optional)


def image_arguments(pipe: Pipeline, request: CheckedRequest) -> dict[str, Any]:
    """The call's image inputs for `request` on `pipe` (none for text-to-image)."""
    if request.image is None:
        return {}
    size = (request.width, request.height)
    # As checked (`normalise_request` fitted a canvas to the output, and left a reference pool's image at its own
    # size); references go as their own pixels: the pipeline scales each as its model was trained (diffusers'
    # FLUX.2: within 1 MP; Qwen-Image-Edit-2509/2511: about 1 MP for the VAE, 384 x 384 for Qwen2.5-VL).
    first = request.image.to_pil()
    references = [image.to_pil() for image in request.images]
    arguments: dict[str, Any] = {"image": [first, *references] if references else first}
    if request.mask_image is not None:
        arguments["image"] = _resized(request.image, size)
        arguments["mask_image"] = _resized(request.mask_image, size)
        if references:
            # FLUX.2 [klein]'s inpainting (normalise lets references with a mask only where it takes them).
            arguments["image_reference"] = references
    if request.strength is not None:
        arguments["strength"] = request.strength
    accepted = call_parameters(type(pipe))
    return {name: value for name, value in arguments.items() if name in accepted}


def accepted_arguments(pipe: Pipeline, arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` the pipeline's call takes (all of them for a call with `**kwargs`)."""
    accepted = call_parameters(type(pipe))
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return arguments
    return {name: value for name, value in arguments.items() if name in accepted}


def _resized(image: InputImage, size: tuple[int, int]) -> Image.Image:
    """A new PIL image of `image` at `size` (Lanczos, as diffusers' own `resize_mode="default"` resamples)."""
    pil = image.to_pil()
    return pil if pil.size == size else pil.resize(size, Image.Resampling.LANCZOS)
