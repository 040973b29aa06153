"""Known, harmless library warnings at start-up, filtered so that the start log shows the app's own lines first.

`quiet_known_warnings()` is the entry point's first call (`app.main`), before the libraries are imported: each
filter sits on the one library logger that emits its message and drops only that message, matched by its text,
so every other line of those loggers (and every message of a kind not listed here) still shows. Each says why
it is harmless. Importing this module imports no library (the app's import stays light).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

__all__ = ["KNOWN_HARMLESS", "Known", "quiet_known_warnings"]


@dataclass(frozen=True)
class Known:
    """A harmless start-up message: the logger that emits it, its text (a regex searched in it), and why."""

    logger: str
    pattern: str
    why: str

    def filter(self, record: logging.LogRecord) -> bool:
        """False (drop) for this message, True for any other record."""
        return re.search(self.pattern, record.getMessage()) is None


KNOWN_HARMLESS = (
    Known(
        "torchao",
        r"^Failed to load .*torchao.*\.so: ",
        # torchao ships CUDA/CUTLASS kernels (mxfp8, sm90a) as shared libraries built for one Python and CUDA; on a
        # machine without them each fails to load. The engine's fp8 and int4 pools use torchao's Python paths and
        # torch's own kernels, never these (engine.weights.quantized), so nothing it runs is missing.
        "torchao's optional CUDA extension kernels, which the engine never calls",
    ),
    Known(
        "torch.utils._pytree",
        r"is an Enum subclass and is now natively supported by torch\.compile",
        # torchao registers its Enums as pytree constants, which newer torch handles natively: a deprecation note
        # addressed to torchao, raised while importing it; nothing of ours registers one.
        "torchao's Enum registration, deprecated by torch but still working",
    ),
    Known(
        "diffusers.quantizers.torchao.torchao_quantizer",
        r"^Unable to import `torchao` Tensor objects",
        # diffusers' torchao quantizer lists torchao's serialized tensor classes to allow them in `torch.load`;
        # the engine never loads a torchao-serialized checkpoint (it quantizes bf16 weights as they load).
        "diffusers' note on loading torchao-serialized checkpoints, which the engine never does",
    ),
    Known(
        "transformers.utils.import_utils",
        r"requires torchvision \(not installed\); falling back to `\w+Pil`",
        # Without torchvision transformers hands out the PIL image processors (the slow ones it always had): the
        # same outputs for the few reference images an editing pool encodes; requirements.txt leaves torchvision out.
        "transformers' PIL image processors instead of the torchvision ones: the same results",
    ),
    Known(
        "diffusers.configuration_utils",
        r"^The config attributes .* were passed to \w*Scheduler, but are not expected and will be ignored",
        # The engine offers each pool the schedulers compatible with its own (`engine.pipeline.schedulers` builds
        # each from the pool's scheduler config once, to see that it loads): a config key another class does not
        # read is dropped by design, so the note says nothing about the pool's own scheduler.
        "a scheduler built from another scheduler's config ignores the keys it does not read, by design",
    ),
)


def quiet_known_warnings() -> None:
    """Install each `KNOWN_HARMLESS` filter on its logger (once: a second call adds none)."""
    for known in KNOWN_HARMLESS:
        logger = logging.getLogger(known.logger)
        if known not in logger.filters:
            logger.addFilter(known)
