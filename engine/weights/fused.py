"""The adapter set fused into the pipeline right now, and the one way it changes: swap, roll back, restore.

`WeightPatcher` (engine.weights.swap) writes the weights (on a quantized pool `BranchedPatcher`, which gives
the denoiser's layers to low-rank branches: engine.weights.branches) and `TokenPatcher` (engine.formats.pivotal)
the pivotal-tuning rows of the text encoders' embeddings; this class decides what they write, always both together, and
remembers what is fused, for the scheduler's affinity, the status panel and a rollback after a failed
request. Callers hold the engine's pipeline lock for `swap`, `rollback`, `restore_all` and for reading
`tokenizers` (what a run of the fused set tokenizes with); the fused set is also read from other threads
(status, the scheduler), so it is only touched under its own lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import torch

from engine.caches.store import AdapterStore
from engine.formats.adapters import PreparedAdapter
from engine.requests import LoraSpec
from engine.schedules import scales_at
from engine.weights.branches import BranchedPatcher
from engine.weights.swap import ActiveAdapter, WeightPatcher
from engine.weights.tokens import TokenPatcher

__all__ = ["FusedSet", "StepHook", "set_identity", "stepped_weights"]

logger = logging.getLogger(__name__)

_NOTHING_KEPT = object()
_MIXED = object()


Scaled = tuple[PreparedAdapter, float, float | None]
# Called before a run's step (`step`, of `steps`): `engine.pipeline.inference.infer`'s `at_step`.
StepHook = Callable[[int, int], None]


def set_identity(adapters: Sequence[Scaled]) -> Hashable:
    """A set of (adapter, scale, scale_2) as the scheduler compares them (equal identities: no swap)."""
    return tuple(sorted((str(a.key), s, s2) for a, s, s2 in adapters))


class FusedSet:
    def __init__(
        self,
        patcher: WeightPatcher | BranchedPatcher,
        tokens: TokenPatcher,
        store: AdapterStore,
        *,
        per_call: bool,
        device: torch.device,
        on_swap: Callable[[float], None],
        denoiser: frozenset[int] | None = None,
    ) -> None:
        self._patcher = patcher
        # The weights a run's steps read (the denoisers': `stepped_weights`), the only ones a step boundary
        # rewrites; None: every weight (a set without text encoders).
        self._denoiser = denoiser
        self._tokens = tokens
        self._store = store
        # ZeroGPU: every call starts from the base and fuses its own set, so nothing stays fused.
        self._per_call = per_call
        self._device = device
        self._on_swap = on_swap
        self._lock = threading.Lock()
        self._applied: tuple[ActiveAdapter, ...] = ()
        # After a step boundary: the denoisers hold `_applied`, the text encoders still step 0's scales.
        self._mixed = False

    @property
    def applied(self) -> tuple[ActiveAdapter, ...]:
        with self._lock:
            return self._applied

    @property
    def tokenizers(self) -> Mapping[str, Any]:
        """Pipeline attribute -> tokenizer that knows the fused set's pivotal tokens (empty: the base ones)."""
        return self._tokens.tokenizers

    @property
    def pristine_bytes(self) -> int:
        return self._patcher.pristine_bytes

    def identity(self) -> Hashable:
        """The fused set's identity, as `set_identity` gives it for a request (the scheduler's affinity)."""
        if self._per_call:
            return _NOTHING_KEPT  # every call re-applies its set: no request finds it fused
        with self._lock:
            if self._mixed:
                return _MIXED  # no request's set: the next one swaps in full
            return tuple(sorted((str(a.adapter.key), a.scale, a.scale_2) for a in self._applied))

    def swap(self, adapters: Sequence[Scaled]) -> tuple[bool, float]:
        """Fuse exactly this set (the base for none); returns (whether weights changed, seconds)."""
        wanted = _sorted(adapters)
        identity = tuple((a.key, s, s2) for a, s, s2 in wanted)
        with self._lock:
            previous, mixed = self._applied, self._mixed
        fused = tuple((a.adapter.key, a.scale, a.scale_2) for a in previous)
        if not self._per_call and not mixed and identity == fused:
            return False, 0.0
        if not wanted and not self._patcher.dirty and not self._tokens.active:
            return False, 0.0
        started = time.perf_counter()
        active = tuple(ActiveAdapter(self._store.for_compute(a), s, s2) for a, s, s2 in wanted)
        self._apply(active)
        if self._device.type == "cuda":
            # Wait for this swap's own stream only: a device-wide sync would also wait for another pool's inference.
            torch.cuda.current_stream(self._device).synchronize()
        elapsed = time.perf_counter() - started
        logger.info(
            "swap %s -> %s: %d layers, tokens %s in %.1f ms",
            _describe(previous),
            _describe(active),
            sum(len(a.adapter.layers) for a in active),
            "".join(self._tokens.active) or "none",
            elapsed * 1000,
        )
        self._set(active)
        self._on_swap(elapsed)
        return True, elapsed

    def stepper(self, loras: Sequence[LoraSpec], adapters: Sequence[Scaled]) -> StepHook | None:
        """A scheduled request's step hook (None for a request without a schedule): `hook(step, steps)` before step
        `step` of a run of `steps` makes the denoisers' weights that step's (`engine.schedules.scales_at`) where
        they differ from what the hook left fused, and no work elsewhere: only the denoisers' weights of the LoRAs
        whose scale changes there are rewritten (`_boundary`), never the text encoders', which ran before step 0
        at its scales (the documented rule). `adapters` are the request's, as it swapped to them before its run
        (step 0's scales)."""
        if not any(spec.scheduled for spec in loras):
            return None
        fused = [scales_at(loras, adapters, 0, 1)]

        def hook(step: int, steps: int) -> None:
            wanted = scales_at(loras, adapters, step, steps)
            if _identity(wanted) != _identity(fused[0]):
                # Called from inside the run's inference mode: what a rewrite allocates (its scratch) must stay a
                # normal tensor, which later swaps outside it write to.
                with torch.inference_mode(False):
                    self._boundary(fused[0], wanted)
                fused[0] = wanted

        return hook

    def _boundary(self, before: Sequence[Scaled], after: Sequence[Scaled]) -> None:
        """From the set `before` to the same adapters at `after`'s scales, rewriting only the denoisers' weights
        whose updates change (`_changed`); the set is then marked mixed, so that the next request swaps in full."""
        started = time.perf_counter()
        indices = self._changed(before, after)
        active = tuple(ActiveAdapter(self._store.for_compute(a), s, s2) for a, s, s2 in _sorted(after))
        self._patcher.rewrite(active, indices)
        if self._device.type == "cuda":
            torch.cuda.current_stream(self._device).synchronize()
        elapsed = time.perf_counter() - started
        logger.info("step boundary -> %s: %d weights in %.1f ms", _describe(active), len(indices), elapsed * 1000)
        with self._lock:
            self._applied, self._mixed = active, True
        self._on_swap(elapsed)

    def _changed(self, before: Sequence[Scaled], after: Sequence[Scaled]) -> set[int]:
        """The denoisers' weights an adapter of `after` (the adapters of `before`, in order) updates at another
        scale than in `before`: each weight's scale as `ActiveAdapter.scale_at` reads it (a pair's sides apart)."""
        second = self._patcher.second
        changed: set[int] = set()
        for (adapter, scale, scale_2), (_, new, new_2) in zip(before, after, strict=True):
            old_item, new_item = ActiveAdapter(adapter, scale, scale_2), ActiveAdapter(adapter, new, new_2)
            changed.update(
                layer.target
                for layer in adapter.layers
                if old_item.scale_at(layer.target, second) != new_item.scale_at(layer.target, second)
            )
        return changed if self._denoiser is None else changed & self._denoiser

    def rollback(self, previous: tuple[ActiveAdapter, ...]) -> None:
        """After a failed request: fuse what was served before it, or the base if even that fails."""
        try:
            self._apply(previous)
            self._set(previous)
        except BaseException:
            logger.exception("could not re-apply %s after a failure; serving the base model", _describe(previous))
            self.restore_all()

    def after_call(self) -> None:
        """ZeroGPU: a call leaves the base weights behind (the next one fuses its own set)."""
        if self._per_call:
            self.restore_all()

    def restore_all(self) -> None:
        """The base weights and embeddings back."""
        self._patcher.restore_all()
        self._tokens.restore()
        self._set(())

    def forget_pristine(self) -> None:
        """Drop the pristine copies of clean weights (after `restore_all`: all of them), freeing their memory."""
        self._patcher.forget_pristine()

    def _apply(self, active: tuple[ActiveAdapter, ...]) -> None:
        # Weights first, then the rows: a failure in either leaves it to the caller's rollback, which
        # applies both again (TokenPatcher itself leaves the base rows behind when it fails).
        self._patcher.apply(active)
        self._tokens.apply(a.adapter.embeddings for a in active)

    def _set(self, active: tuple[ActiveAdapter, ...]) -> None:
        with self._lock:
            self._applied, self._mixed = active, False
        self._store.set_active(a.adapter.key for a in active)


def stepped_weights(names: Sequence[str], components: Sequence[str]) -> frozenset[int]:
    """The indices of `names` (a `TargetTable`'s, `component.module`) in `components` (the denoisers:
    `FamilySpec.stored`): the weights a step boundary may rewrite."""
    prefixes = tuple(f"{component}." for component in components)
    return frozenset(i for i, name in enumerate(names) if name.startswith(prefixes))


def _sorted(adapters: Sequence[Scaled]) -> list[Scaled]:
    """A set in the one order its updates are summed in (a swap's and a boundary's alike)."""
    return sorted(adapters, key=lambda item: (str(item[0].key), item[1], item[2] or 0.0))


def _identity(adapters: Sequence[Scaled]) -> Hashable:
    return tuple((a.key, s, s2) for a, s, s2 in adapters)


def _describe(active: tuple[ActiveAdapter, ...]) -> str:
    return "[" + ", ".join(f"{a.adapter.key.name}×{a.scale:g}" for a in active) + "]"
