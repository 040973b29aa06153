"""The swap benchmark's command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.families.registry import spec_for
from families import Family

from .ours import FORMATS

__all__ = ["FAMILIES", "FAMILY_VALUES", "HEADLINE_RANK", "VARIANTS", "Options", "parse_options"]

HEADLINE_RANK = 32
# The models the benchmark swaps on: SDXL's whole UNet, or a real-width slice of FLUX.1's or Qwen-Image's
# transformer; each as the engine's family (`families.Family`) it is.
FAMILIES = ("sdxl", "flux", "qwen", "wan", "krea2", "ltx2")
FAMILY_VALUES = {"sdxl": "sdxl", "flux": "flux", "qwen": "qwen_image", "wan": "wan", "krea2": "krea2", "ltx2": "ltx2"}
# FLUX and Qwen-Image LoRAs are trained at higher ranks than SDXL's (ai-toolkit's, sd-scripts' and musubi-tuner's
# defaults: 16 and up).
_FLUX_HEADLINE_RANK = 64
VARIANTS = ("loha", "lokr", "dora")
# How messages name the transformer slices (no LyCORIS on them).
_DIT_LABELS = {"flux": "FLUX", "qwen": "Qwen-Image", "wan": "Wan", "krea2": "Krea 2", "ltx2": "LTX-2"}
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class Options:
    device: torch.device
    dtype: torch.dtype
    ranks: tuple[int, ...]
    formats: tuple[str, ...]
    repeats: int
    reference_repeats: int
    leak_swaps: int
    threads: int | None
    quick: bool
    json_path: Path | None
    workdir: Path | None
    variants: tuple[str, ...] = ()  # LyCORIS/DoRA formats measured against the floor (section "formats")
    full: bool = False
    plot_dir: Path | None = None
    family: str = "sdxl"
    # `--pair` (Wan only): Wan 2.2 A14B's two transformers swapped together, against a floor for each.
    pair: bool = False

    @property
    def headline_rank(self) -> int:
        wanted = _FLUX_HEADLINE_RANK if _is_dit(self.family) else HEADLINE_RANK
        return wanted if wanted in self.ranks else self.ranks[0]

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def as_dict(self) -> dict[str, object]:
        return {
            "device": str(self.device),
            "dtype": self.dtype_name,
            "ranks": list(self.ranks),
            "formats": list(self.formats),
            "repeats": self.repeats,
            "reference_repeats": self.reference_repeats,
            "leak_swaps": self.leak_swaps,
            "threads": self.threads,
            "quick": self.quick,
            "variants": list(self.variants),
            "full": self.full,
            "family": self.family,
        }


@dataclass(frozen=True)
class _Defaults:
    ranks: tuple[int, ...]
    repeats: int
    reference_repeats: int
    leak_swaps: int
    variants: tuple[str, ...]


# The default run fits about 15 minutes on 2 cores; --full is the sweep, --quick a smoke run.
_DEFAULT = _Defaults(ranks=(8, 32), repeats=4, reference_repeats=1, leak_swaps=24, variants=VARIANTS)
_FULL = _Defaults(ranks=(8, 32, 128), repeats=7, reference_repeats=3, leak_swaps=200, variants=VARIANTS)
_QUICK = _Defaults(ranks=(8,), repeats=3, reference_repeats=1, leak_swaps=20, variants=("loha",))
# FLUX and Qwen-Image: ranks 16 and 64; no LyCORIS section (diffusers' loaders of these read no LoHa/LoKr).
_FLUX = _Defaults(ranks=(16, 64), repeats=4, reference_repeats=1, leak_swaps=24, variants=())
_FLUX_FULL = _Defaults(ranks=(16, 64, 128), repeats=7, reference_repeats=3, leak_swaps=200, variants=())
_FLUX_QUICK = _Defaults(ranks=(16,), repeats=3, reference_repeats=1, leak_swaps=20, variants=())


def _ranks(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of ranks; accepted: e.g. 8,32,128") from e
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of ranks; accepted: positive integers like 8,32,128")
    return tuple(dict.fromkeys(values))


def _formats(text: str) -> tuple[str, ...]:
    values = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    if not values or any(v not in FORMATS for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} names an unknown format; accepted: {','.join(FORMATS)}")
    return values


def _variants(text: str) -> tuple[str, ...]:
    values = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    if any(v not in VARIANTS for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} names an unknown variant; accepted: {','.join(VARIANTS)} or none")
    return values


def parse_options(argv: Sequence[str] | None = None, description: str | None = None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.swap", description=description)
    parser.add_argument(
        "--family",
        choices=FAMILIES,
        default="sdxl",
        help="sdxl: the whole SDXL UNet; flux: FLUX.1's transformer at real width, 2 double + 4 single blocks; "
        "qwen: Qwen-Image's transformer at real width, 3 blocks; wan: Wan's 14B transformer at real width, 2 blocks; "
        "krea2: Krea 2's transformer at real width, 2 blocks; "
        "ltx2: LTX-2 19B's audio-video transformer at real width, 2 blocks",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=tuple(_DTYPES), default="bfloat16")
    parser.add_argument(
        "--ranks", type=_ranks, help="LoRA ranks (default 8,32; --full: 8,32,128; --quick: 8; FLUX, Qwen: 16,64)"
    )
    parser.add_argument("--formats", type=_formats, default=FORMATS, help="peft,kohya (default: both)")
    parser.add_argument(
        "--variants",
        type=_variants,
        help="LyCORIS/DoRA formats timed against the floor: loha,lokr,dora (default: all; --quick: loha; '' for none)",
    )
    parser.add_argument("--repeats", type=int, help="timed swaps per method (default 4; --full: 7; --quick: 3)")
    parser.add_argument(
        "--reference-repeats",
        type=int,
        help="timed reference cycles per rank and format (default 1; --full: 3; --quick: 1)",
    )
    parser.add_argument(
        "--leak-swaps", type=int, help="swaps of ours between two RSS readings (default 24; --full: 200; --quick: 20)"
    )
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's own choice)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: rank 8, few repeats")
    parser.add_argument(
        "--pair", action="store_true", help="wan only: A14B's two transformer slices swapped together (bench.swap_pair)"
    )
    parser.add_argument("--full", action="store_true", help="the full sweep: ranks 8,32,128, 7 repeats, 3 cycles")
    parser.add_argument("--json", type=Path, dest="json_path", help="also write every number to this file")
    parser.add_argument("--workdir", type=Path, help="where the LoRA files go (default: a temporary folder)")
    parser.add_argument(
        "--plot", type=Path, dest="plot_dir", help="write the JSON and its plot (swap time against rank) here"
    )
    args = parser.parse_args(argv)
    default = _checked_defaults(parser, args)
    quick, full = args.quick, args.full
    return Options(
        device=torch.device(args.device),
        dtype=_DTYPES[args.dtype],
        ranks=args.ranks or default.ranks,
        formats=args.formats,
        repeats=args.repeats or default.repeats,
        reference_repeats=args.reference_repeats or default.reference_repeats,
        leak_swaps=args.leak_swaps if args.leak_swaps is not None else default.leak_swaps,
        threads=args.threads,
        quick=quick,
        json_path=args.json_path,
        workdir=args.workdir,
        variants=args.variants if args.variants is not None else default.variants,
        full=full,
        plot_dir=args.plot_dir,
        family=args.family,
        pair=args.pair,
    )


def _checked_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace) -> _Defaults:
    """The run's defaults (by family and --quick/--full), after refusing what cannot run, naming what can."""
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda was asked for, but torch sees no CUDA device; accepted: cpu on this machine")
    for name in ("repeats", "reference_repeats", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} {value} is too small; accepted: 1 or more")
    if args.leak_swaps is not None and args.leak_swaps < 0:
        parser.error(f"--leak-swaps {args.leak_swaps} is negative; accepted: 0 (skip) or more")
    quick, full = args.quick, args.full
    if args.pair and args.family != "wan":
        parser.error(f"--pair with --family {args.family}; accepted: --pair with --family wan (Wan 2.2 A14B)")
    if quick and full:
        parser.error("--quick and --full were both given; accepted: one of them")
    if not _is_dit(args.family):
        return _QUICK if quick else _FULL if full else _DEFAULT
    if args.variants:
        parser.error(
            f"--variants {','.join(args.variants)} with --family {args.family}; accepted: none (no LyCORIS "
            f"on {_DIT_LABELS[args.family]})"
        )
    return _FLUX_QUICK if quick else _FLUX_FULL if full else _FLUX


def _is_dit(name: str) -> bool:
    """Whether the model `name` swaps on is a transformer (its family's spec says where its denoiser is)."""
    return spec_for(Family(FAMILY_VALUES[name])).denoiser == "transformer"
