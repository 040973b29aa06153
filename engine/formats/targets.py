"""`TargetTable`: every weight of a pipeline a LoRA may change, indexed once, and how its LoRAs' names convert
(the served family's converter). `engine.formats.adapters` maps a file's tensors onto it.

Every Linear/Conv2d weight comes first. A family that applies full differences (`FamilySpec.full_differences`:
Wan's) has every other parameter of its components indexed after them: each Linear's bias (`<module>.bias`, a
bias delta's or a `.diff_b`'s target), then the rest (norms, modulation tables, a patch embedding), each by its
parameter name; those are a full difference's targets only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from diffusers import StableDiffusionXLPipeline
from torch import nn

from engine.families import unet
from engine.families.spec import FullDifferences, LoraConverter, LycorisModules, UnappliedPart
from engine.formats.naming import kohya_modules

__all__ = ["TargetTable"]

# SDXL's converter: what a table made without a family's (tests and benchmarks over an SDXL UNet) converts with.
_SDXL_CONVERTER = unet.converter(StableDiffusionXLPipeline)


def _lora_shape(module: nn.Linear | nn.Conv2d) -> tuple[int, ...]:
    if isinstance(module, nn.Linear):
        return (module.out_features, module.in_features)
    return tuple(module.weight.shape)


class TargetTable:
    """Every Linear/Conv2d weight a LoRA may change, indexed once per pipeline, and how its LoRAs' names convert.

    `components` are the pipeline's adaptable models by attribute (the family's `FamilySpec.components`),
    `denoiser` the one that denoises (`unet`, `transformer`), `convert_lora` the family's converter,
    `full_differences` its placing of full differences (then every other parameter is indexed too),
    `unapplied_parts` the parts of its files its converter drops by design (`FamilySpec.unapplied_parts`).
    """

    def __init__(
        self,
        components: Mapping[str, nn.Module],
        *,
        denoiser: str = "unet",
        convert_lora: LoraConverter = _SDXL_CONVERTER,
        full_differences: FullDifferences | None = None,
        lycoris_modules: LycorisModules | None = None,
        unapplied_parts: tuple[UnappliedPart, ...] = (),
    ) -> None:
        if denoiser not in components:
            raise ValueError(f"the denoiser {denoiser!r} is not among the components {', '.join(components)}")
        self._convert_lora = convert_lora
        self._lycoris_modules = lycoris_modules
        self.unapplied_parts = unapplied_parts
        # The family's placing of full differences (`FamilySpec.full_differences`): where set, every parameter of
        # the components is a target, after every Linear/Conv2d weight.
        self.full_differences = full_differences
        self._denoiser_module = components[denoiser]
        self.denoiser = denoiser
        # The pipeline's adaptable components (SD 1.x/2.x: unet, text_encoder; FLUX: transformer, text_encoder).
        self.components = tuple(components)
        self.params: list[torch.Tensor] = []
        # Each weight's shape as a LoRA sees it: a linear's (out, in), also where its weight is stored in blocks
        # of another shape (a GGUF file's rows x bytes: engine.weights.gguf).
        self.shapes: list[tuple[int, ...]] = []
        # `component.module` per index (a parameter past `module_weights`: `component.parameter`): LyCORIS/DoRA
        # modules, errors, components touched.
        self.names: list[str] = []
        self._index: dict[tuple[str, str], int] = {}
        # `component.parameter` -> index, for every target a full difference may name (its Linear/Conv2d weights
        # by `<module>.weight` too); empty where the family applies none.
        self._parameters: dict[str, int] = {}
        for component, model in components.items():
            for name, module in model.named_modules():
                if isinstance(module, nn.Linear | nn.Conv2d):
                    self._index[(component, name)] = len(self.params)
                    self.params.append(module.weight)
                    self.shapes.append(_lora_shape(module))
                    self.names.append(f"{component}.{name}")
        self.module_weights = len(self.params)
        if full_differences is not None:
            self._index_parameters(components)
        self._flat_text = {c: not hasattr(m, "text_model") for c, m in components.items()}

    def _index_parameters(self, components: Mapping[str, nn.Module]) -> None:
        """Each Linear's bias (`<module>.bias`), then every other parameter of no Linear/Conv2d (a 0-d one aside:
        no file's difference names one), after the module weights; a parameter two modules share, once."""
        indexed = {id(param): index for index, param in enumerate(self.params)}
        for component, model in components.items():
            for name, module in model.named_modules():
                if isinstance(module, nn.Linear | nn.Conv2d):
                    self._parameters[f"{component}.{name}.weight"] = self._index[(component, name)]
        for component, model in components.items():
            for name, module in model.named_modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    self._add(f"{component}.{name}.bias", module.bias, indexed)
        for component, model in components.items():
            for name, module in model.named_modules():
                if not isinstance(module, nn.Linear | nn.Conv2d):
                    for own, param in module.named_parameters(recurse=False):
                        if param.dim():
                            self._add(f"{component}.{name}.{own}" if name else f"{component}.{own}", param, indexed)

    def _add(self, name: str, param: torch.Tensor, indexed: dict[int, int]) -> None:
        if id(param) not in indexed:
            indexed[id(param)] = len(self.params)
            self.params.append(param)
            self.shapes.append(tuple(param.shape))
            self.names.append(name)
        self._parameters[name] = indexed[id(param)]

    def parameter(self, name: str) -> int | None:
        """The index of parameter `component.parameter` (a full difference's target); None where it is no target."""
        return self._parameters.get(name)

    def module_weight(self, index: int) -> bool:
        """Whether target `index` is a Linear/Conv2d weight (not a bias, norm or other parameter)."""
        return index < self.module_weights

    def lookup(self, component: str, module: str) -> int | None:
        if self._flat_text.get(component):
            # Published CLIP LoRAs name modules under `text_model.`; recent transformers flattened it.
            module = module.removeprefix("text_model.")
        return self._index.get((component, module))

    def __len__(self) -> int:
        return len(self.params)

    def convert(self, state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], Mapping[str, Any] | None]:
        """A file's plain factors in diffusers' names, with the network alphas read (the family's converter)."""
        return self._convert_lora(state_dict, self._denoiser_module)

    def family_modules(self, stem: str) -> tuple[int, ...] | None:
        """The targets of a LyCORIS module the family names itself (`FamilySpec.lycoris_modules`): one layer, or a
        fused layer's parts in order; None where the family does not name it (or names a layer not served)."""
        modules = self._lycoris_modules(stem, self._denoiser_module) if self._lycoris_modules else None
        found = [self.lookup(self.denoiser, m) for m in modules or ()]
        return tuple(i for i in found if i is not None) if found and None not in found else None

    def kohya_modules(self, stems: list[str], label: str) -> dict[str, tuple[str, str]]:
        """(component, module) of each kohya module name (`engine.formats.naming.kohya_modules`)."""
        return kohya_modules(stems, self.convert, self.components, self.denoiser, label)
