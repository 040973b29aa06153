"""One factory for every registered family's tiny pipeline in the tests: its folder, the pipeline loaded from it
like a real one, and a pristine copy of its weights, each made on first use and kept for the session.

A family gets these by being registered with a tiny model id (`families.<family>.IDENTITY.tiny_id`): the root
conftest names them `tiny_<family>_dir`, `loaded_<family>` and `pristine_<family>` (SDXL's, the default pool's,
also `tiny_dir`, `loaded` and `pristine`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from families import IDENTITIES, Family

# The families with a tiny pipeline, in the registry's order.
TINY_FAMILIES: tuple[Family, ...] = tuple(f for f, identity in IDENTITIES.items() if identity.tiny_id)


class TinyFolders:
    """Each tiny family's pipeline saved as an ordinary diffusers folder, once a session."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_path_factory
        self._made: dict[Family, Path] = {}

    def __call__(self, family: Family) -> Path:
        if family not in self._made:
            from engine.families.tiny import ensure_tiny_pipeline

            tiny_id = IDENTITIES[family].tiny_id
            assert tiny_id is not None, f"{family} has no tiny pipeline"
            folder = self._tmp.mktemp(f"tiny-{family.value}") / "pipeline"
            self._made[family] = ensure_tiny_pipeline(folder, model_id=tiny_id)
        return self._made[family]


class TinyModels:
    """Each tiny family's pipeline loaded from its folder (`load_pipeline`, as a real one) under the session's
    settings with the family's base model id, and every weight of it as first loaded (bit-exact checks)."""

    def __init__(self, folders: TinyFolders, settings: Any) -> None:
        self.folder = folders
        self._settings = settings
        self._loaded: dict[Family, Any] = {}
        self._pristine: dict[Family, dict[str, Any]] = {}

    def loaded(self, family: Family) -> Any:
        if family not in self._loaded:
            from engine.pipeline.loading import load_pipeline

            settings = self._settings.replace(
                model_id=str(self.folder(family)), base_model_id=IDENTITIES[family].model_id
            )
            self._loaded[family] = load_pipeline(settings)
        return self._loaded[family]

    def pristine(self, family: Family) -> dict[str, Any]:
        if family not in self._pristine:
            import torch

            pipe = self.loaded(family).pipe
            modules = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
            self._pristine[family] = {
                f"{name}.{key}": value.detach().clone()
                for name, module in modules.items()
                for key, value in module.state_dict().items()
            }
        return self._pristine[family]


# The input-image area the tiny Qwen-Image-Edit pipelines condition on (pixels). diffusers' edit pipelines scale
# every input image to about 1 MP before the VAE encodes it (`calculate_dimensions(1024 * 1024, ...)` inline in
# QwenImageEditPipeline's and QwenImageEditInpaintPipeline's calls, `VAE_IMAGE_SIZE` in QwenImageEditPlusPipeline's),
# as the real model was trained: a tiny edit then carried 4096 latent tokens of its input image through the
# transformer beside its 16 of output, about 1000 of the suite's 1860 worker-seconds. A test-size setting for the
# whole session, read by diffusers' own pipelines alike wherever they run in it (our engine's call and the
# diffusers reference it is compared with): 128 x 128, still the tiny processor's full 112 px for Qwen2.5-VL and
# twice the tests' 64 px inputs and outputs. The engine's code path is unchanged (it never names the area).
TINY_CONDITION_AREA = 128 * 128
_EDIT_MODULES = ("pipeline_qwenimage_edit", "pipeline_qwenimage_edit_inpaint", "pipeline_qwenimage_edit_plus")


def small_edit_conditions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cap the area diffusers' edit pipelines scale an input image to at TINY_CONDITION_AREA (each module's own
    `calculate_dimensions`, which every such scaling goes through)."""
    import importlib

    for name in _EDIT_MODULES:
        module = importlib.import_module(f"diffusers.pipelines.qwenimage.{name}")
        original = module.calculate_dimensions

        def capped(target_area: float, ratio: float, _original: Any = original) -> Any:
            return _original(min(target_area, TINY_CONDITION_AREA), ratio)

        monkeypatch.setattr(module, "calculate_dimensions", capped)
