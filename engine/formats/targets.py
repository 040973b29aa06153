"""`TargetTable`: every weight of a pipeline a LoRA may change, indexed once, and how its LoRAs' names convert
(the served family's converter). `engine.formats.adapters` maps a file's tensors onto it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from diffusers import StableDiffusionXLPipeline
from torch import nn

from engine.families import unet
from engine.families.spec import LoraConverter
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
    `denoiser` the one that denoises (`unet`, `transformer`), `convert_lora` the family's converter.
    """

    def __init__(
        self,
        components: Mapping[str, nn.Module],
        *,
        denoiser: str = "unet",
        convert_lora: LoraConverter = _SDXL_CONVERTER,
        bias_deltas: Callable[[str], bool] | None = None,
    ) -> None:
        if denoiser not in components:
            raise ValueError(f"the denoiser {denoiser!r} is not among the components {', '.join(components)}")
        self._convert_lora = convert_lora
        # The family's bias-delta names (`FamilySpec.bias_deltas`): where set, each Linear's bias is a target too,
        # as `<module>.bias` (a bias delta's), after every weight.
        self.bias_deltas = bias_deltas
        self._denoiser_module = components[denoiser]
        self.denoiser = denoiser
        # The pipeline's adaptable components (SD 1.x/2.x: unet, text_encoder; FLUX: transformer, text_encoder).
        self.components = tuple(components)
        self.params: list[torch.Tensor] = []
        # Each weight's shape as a LoRA sees it: a linear's (out, in), also where its weight is stored in blocks
        # of another shape (a GGUF file's rows x bytes: engine.weights.gguf).
        self.shapes: list[tuple[int, ...]] = []
        self.names: list[str] = []  # `component.module` per index: LyCORIS/DoRA modules, errors, components touched
        self._index: dict[tuple[str, str], int] = {}
        for component, model in components.items():
            for name, module in model.named_modules():
                if isinstance(module, nn.Linear | nn.Conv2d):
                    self._index[(component, name)] = len(self.params)
                    self.params.append(module.weight)
                    self.shapes.append(_lora_shape(module))
                    self.names.append(f"{component}.{name}")
        if bias_deltas is not None:
            for component, model in components.items():
                for name, module in model.named_modules():
                    if isinstance(module, nn.Linear) and module.bias is not None:
                        self._index[(component, f"{name}.bias")] = len(self.params)
                        self.params.append(module.bias)
                        self.shapes.append((module.out_features,))
                        self.names.append(f"{component}.{name}.bias")
        self._flat_text = {c: not hasattr(m, "text_model") for c, m in components.items()}

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

    def kohya_modules(self, stems: list[str], label: str) -> dict[str, tuple[str, str]]:
        """(component, module) of each kohya module name (`engine.formats.naming.kohya_modules`)."""
        return kohya_modules(stems, self.convert, self.components, self.denoiser, label)
