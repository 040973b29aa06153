"""LoRA fixtures made during the tests, in the formats found in the wild, and Hub repos around them.

`publish_fixtures` writes every fixture repo to a stand-in Hub and returns what
the tests need to name them. Good LoRAs come in diffusers/PEFT naming (with and
without diffusers' adapter metadata) and kohya naming (SGM block names, `.alpha`,
kohya's metadata, conv layers); bad ones cover each way a file or repo can be wrong.
"""

from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from PIL import Image
from safetensors.torch import save

from serving.demo.synthetic import (
    TEXT_ATTENTION,
    UNET_ATTENTION,
    UNET_ATTENTION_FF_CONV,
    LoraTarget,
    find_targets,
    kohya_key,
    kohya_metadata,
    make_embeddings,
    make_lora,
    peft_metadata,
)
from serving.demo.synthetic_lycoris import lycoris_metadata, make_dora, make_loha, make_lokr

SDXL = "stabilityai/stable-diffusion-xl-base-1.0"
SD15 = "stable-diffusion-v1-5/stable-diffusion-v1-5"
FLUX = "black-forest-labs/FLUX.1-dev"
NS = "fixtures"
WEIGHTS = "pytorch_lora_weights.safetensors"


@dataclass(frozen=True)
class Fixtures:
    """Repo ids by role, and the local files made for them."""

    repos: dict[str, str]
    local_dir: Path
    local: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> str:
        return self.repos[name]


def targets_for(pipe, unet_patterns=UNET_ATTENTION) -> list[LoraTarget]:
    components = {"unet": pipe.unet, "text_encoder": pipe.text_encoder, "text_encoder_2": pipe.text_encoder_2}
    patterns = {"unet": unet_patterns, "text_encoder": TEXT_ATTENTION, "text_encoder_2": TEXT_ATTENTION}
    return find_targets(components, patterns)


def card(base: str | list[str] | None = SDXL, **fields: object) -> bytes:
    data: dict[str, object] = {"tags": ["lora", "text-to-image", "stable-diffusion-xl"], **fields}
    if base is not None:
        data["base_model"] = base
    front = yaml.safe_dump(data, sort_keys=False)
    return f"---\n{front}---\n\n# A fixture LoRA\n".encode()


def png(color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), color).save(buffer, format="PNG")
    return buffer.getvalue()


def sft(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    return save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata)


def peft_file(pipe, *, seed: int, rank: int = 4, alpha: float | None = 8.0, strength: float = 0.2) -> bytes:
    targets = targets_for(pipe)
    tensors = make_lora(targets, rank=rank, seed=seed, fmt="peft", strength=strength)
    metadata = peft_metadata(targets, rank=rank, alpha=alpha) if alpha is not None else None
    return sft(tensors, metadata)


def kohya_file(pipe, *, seed: int, rank: int = 4, alpha: float = 2.0, base_version: str = "sdxl_base_v1-0") -> bytes:
    targets = targets_for(pipe, UNET_ATTENTION_FF_CONV)
    tensors = make_lora(targets, rank=rank, seed=seed, fmt="kohya", alpha=alpha)
    return sft(tensors, kohya_metadata(dim=rank, alpha=alpha, base_version=base_version, title=f"kohya {seed}"))


def variant_file(pipe, variant: str) -> bytes:
    """A small file of an adapter variant the engine refuses: the right module names, that variant's tensors."""
    target = targets_for(pipe)[0]
    stem = kohya_key(target)
    out_ch, in_ch = target.weight_shape[:2]
    if variant == "oft":  # LyCORIS diag-OFT (lycoris/modules/diag_oft.py weight_list)
        tensors = {f"{stem}.oft_blocks": torch.randn(4, out_ch // 4, out_ch // 4)}
    elif variant == "ia3":  # LyCORIS IA3 (lycoris/modules/ia3.py)
        tensors = {f"{stem}.weight": torch.randn(in_ch), f"{stem}.on_input": torch.tensor(True)}
    elif variant == "full-diff":  # LyCORIS full (lycoris/modules/full.py)
        tensors = {f"{stem}.diff": torch.randn(out_ch, in_ch), f"{stem}.diff_b": torch.randn(out_ch)}
    else:  # a LoRA that also trains the bias
        tensors = {f"{stem}.lora_down.weight": torch.randn(2, in_ch), f"{stem}.lora_up.weight": torch.randn(out_ch, 2)}
        tensors[f"{stem}.lora_up.bias"] = torch.randn(out_ch)
    tensors[f"{stem}.alpha"] = torch.tensor(2.0)
    return sft({k: v.half() if v.is_floating_point() else v for k, v in tensors.items()})


def lycoris_file(pipe, variant: str, *, fmt: str, seed: int) -> bytes:
    """A supported LyCORIS/DoRA file over attention, feed-forward and (UNet) conv layers and both text encoders."""
    targets = targets_for(pipe, UNET_ATTENTION_FF_CONV)
    components = {"unet": pipe.unet, "text_encoder": pipe.text_encoder, "text_encoder_2": pipe.text_encoder_2}
    if variant == "loha":
        tensors = make_loha(targets, rank=4, seed=seed, fmt=fmt, alpha=2.0, tucker=True)
    elif variant == "lokr":
        tensors = make_lokr(targets, rank=2, seed=seed, fmt=fmt, alpha=1.0)
    else:
        tensors = make_dora(targets, components, rank=4, seed=seed, fmt=fmt, alpha=2.0)
    return sft(tensors, lycoris_metadata(variant, targets, fmt=fmt, rank=4 if variant != "lokr" else 2, alpha=2.0))


def truncated(data: bytes) -> bytes:
    return data[: len(data) - len(data) // 3]


def lying_header(data: bytes) -> bytes:
    """Claims one tensor lies past the end of the data (a header that lies about offsets)."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    name = next(k for k in header if k != "__metadata__")
    start, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [start, end + 10_000_000]
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data[8 + length :]


def huge_header() -> bytes:
    return struct.pack("<Q", 2**40) + b"{}"


def with_nan(pipe) -> bytes:
    tensors = make_lora(targets_for(pipe), rank=2, seed=5, fmt="peft")
    first = next(iter(tensors))
    tensors[first] = tensors[first].clone()
    tensors[first][0, 0] = float("nan")
    return sft(tensors)


def wrong_shapes(pipe) -> bytes:
    """SDXL-sized factors on the tiny pipeline's module names: names fit, shapes do not."""
    targets = [LoraTarget(t.component, t.module, (640, 640)) for t in targets_for(pipe)[:4]]
    return sft(make_lora(targets, rank=4, seed=6, fmt="peft"))


def unknown_keys(pipe) -> bytes:
    targets = [LoraTarget("unet", "down_blocks.7.attentions.0.transformer_blocks.0.attn1.to_q", (64, 64))]
    return sft(make_lora(targets, rank=4, seed=7, fmt="peft"))


def lying_shape(data: bytes) -> bytes:
    """Claims one tensor is twice the size its offsets give it (a header that lies about sizes)."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [2 * header[name]["shape"][0], *header[name]["shape"][1:]]
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data[8 + length :]


def with_inf(pipe) -> bytes:
    tensors = make_lora(targets_for(pipe), rank=2, seed=21, fmt="peft")
    last = sorted(tensors)[-1]
    tensors[last] = tensors[last].clone()
    tensors[last][-1, -1] = float("-inf")
    return sft(tensors)


def publish_fixtures(hub, pipe, local_dir: Path) -> Fixtures:
    """Create every fixture repo on `hub` for the tiny `pipe`; returns names by role."""
    repos: dict[str, str] = {}

    def add(role: str, files: dict[str, bytes], **kwargs: object) -> None:
        repo_id = f"{NS}/{role}"
        hub.add_repo(repo_id, files, **kwargs)
        repos[role] = repo_id

    def sdxl(role: str, data: bytes, name: str = WEIGHTS, base: object = SDXL, **kwargs: object) -> None:
        add(role, {"README.md": card(base), name: data}, **kwargs)

    widget = [{"text": "a cat in sks style", "output": {"url": "images/preview.png"}}]
    peft_card = card(SDXL, instance_prompt="sks style", license="openrail++", widget=widget)
    peft_files = {"README.md": peft_card, WEIGHTS: peft_file(pipe, seed=1), "images/preview.png": png((200, 40, 40))}
    add("peft", peft_files, downloads=500)
    kohya_card = card([SDXL], instance_prompt="ohwx", license="cc-by-nc-4.0")
    add("kohya", {"README.md": kohya_card, "ohwx_style.safetensors": kohya_file(pipe, seed=2)}, likes=50, downloads=400)
    sdxl("peft-noalpha", peft_file(pipe, seed=3, alpha=None))
    add("second", {"README.md": card(SDXL, instance_prompt="tok"), WEIGHTS: peft_file(pipe, seed=4)})
    # A speed LoRA by its name (LCM: its sampler, 4 steps, guidance 1), listed on the first page.
    add("lcm-lora", {"README.md": card(SDXL), WEIGHTS: peft_file(pipe, seed=27)}, downloads=300)
    sdxl("no-base", peft_file(pipe, seed=8), name="lora.safetensors", base=None)
    sdxl("sd15", peft_file(pipe, seed=9), base=SD15)
    sdxl("flux", peft_file(pipe, seed=10), base=FLUX)
    sdxl("sd15-meta", kohya_file(pipe, seed=11, base_version="sd_v1"), name="lora.safetensors", base=None)
    add("pickle-only", {"README.md": card(SDXL), "pytorch_lora_weights.bin": b"\x80\x04not a real pickle"})
    add("ckpt-only", {"README.md": card(SDXL), "model.ckpt": b"\x80\x04", "model.pt": b"\x80\x04"})
    sdxl("truncated", truncated(peft_file(pipe, seed=12)))
    sdxl("lying-header", lying_header(peft_file(pipe, seed=13)))
    sdxl("huge-header", huge_header())
    sdxl("nan", with_nan(pipe))
    sdxl("wrong-shapes", wrong_shapes(pipe))
    sdxl("unknown-keys", unknown_keys(pipe))
    sdxl("high-rank", peft_file(pipe, seed=14, rank=64))
    add("several", {"README.md": card(SDXL), "a.safetensors": peft_file(pipe, seed=15), "b.safetensors": b"x" * 64})
    for variant in ("oft", "ia3", "full-diff", "lora-bias"):
        sdxl(variant, variant_file(pipe, variant))
    sdxl("loha", lycoris_file(pipe, "loha", fmt="kohya", seed=24), name="loha_style.safetensors")
    sdxl("lokr", lycoris_file(pipe, "lokr", fmt="peft", seed=25))
    sdxl("dora", lycoris_file(pipe, "dora", fmt="kohya", seed=26), name="dora_style.safetensors")
    sdxl("gated", peft_file(pipe, seed=17), gated="auto")
    sdxl("private", peft_file(pipe, seed=18), private=True)
    # Reliability roles (tests/reliability/); "oversize" is fetched by no other test, so its request
    # log shows whether a refused file was downloaded.
    sdxl("lying-shape", lying_shape(peft_file(pipe, seed=22)))
    sdxl("inf", with_inf(pipe))
    sdxl("oversize", peft_file(pipe, seed=23))

    local_dir.mkdir(parents=True, exist_ok=True)
    (local_dir / "styles").mkdir(exist_ok=True)
    (local_dir / "styles" / "local_kohya.safetensors").write_bytes(kohya_file(pipe, seed=19))
    (local_dir / "local_peft.safetensors").write_bytes(peft_file(pipe, seed=20))
    local = {"kohya": "local:styles/local_kohya.safetensors", "peft": "local:local_peft.safetensors"}
    return Fixtures(repos=repos, local_dir=local_dir, local=local)


PIVOTAL_PROMPT = "a photo of <s0><s1>"


def embeddings_file(
    pipe, *, seed: int, count: int = 2, strength: float = 3.0, **overrides: torch.Tensor | None
) -> bytes:
    """Pivotal-tuning rows for the tiny pipeline's two text encoders (`clip_l`, `clip_g`), `overrides` replacing.

    `strength` scales the rows past the existing embeddings' spread so the tokens visibly change the image.
    """
    weights = [pipe.text_encoder.get_input_embeddings().weight, pipe.text_encoder_2.get_input_embeddings().weight]
    std = float(torch.stack([w.detach().float().std() for w in weights]).mean()) * strength
    rows = make_embeddings([w.shape[1] for w in weights], count, seed=seed, std=std)
    return sft({k: v for k, v in {**rows, **overrides}.items() if v is not None})


def pivotal_repo(
    pipe, *, seed: int, emb_name: str, count: int = 2, prompt: str = PIVOTAL_PROMPT, base: str | None = SDXL
) -> dict[str, bytes]:
    """A repo as diffusers' advanced SDXL script publishes it: LoRA, WebUI copy, embeddings file, card."""
    files = {
        "README.md": card(base, instance_prompt=prompt, widget=[{"text": f"{prompt}, a cat"}]),
        WEIGHTS: peft_file(pipe, seed=seed),
        emb_name: embeddings_file(pipe, seed=seed + 1, count=count),
    }
    if emb_name.endswith("_emb.safetensors"):
        files[emb_name.removesuffix("_emb.safetensors") + ".safetensors"] = kohya_file(pipe, seed=seed + 2)
    return files


@dataclass(frozen=True)
class PivotalFixtures:
    """Pivotal-tuning repo ids by role, and a local folder with the same files (`local:` refs by role)."""

    repos: dict[str, str]
    local_dir: Path
    local: dict[str, str]
    files: dict[str, dict[str, bytes]]

    def __getitem__(self, name: str) -> str:
        return self.repos[name]


def publish_pivotal(hub, pipe, local_dir: Path, ns: str = "pivotal") -> PivotalFixtures:
    """Pivotal-tuning repos on `hub` (good ones in both file namings, clashing and broken ones) and local pairs."""
    repos: dict[str, str] = {}
    files: dict[str, dict[str, bytes]] = {}

    def add(role: str, content: dict[str, bytes]) -> None:
        repos[role] = f"{ns}/{role}"
        files[role] = content
        hub.add_repo(repos[role], content)

    add("current", pivotal_repo(pipe, seed=31, emb_name="current_emb.safetensors"))
    add("legacy", pivotal_repo(pipe, seed=34, emb_name="embeddings.safetensors", count=3, prompt="<s0><s1><s2> style"))
    # The rest declare no base, so the catalogue does not list them: listings elsewhere count SDXL fixtures.
    add("clash", pivotal_repo(pipe, seed=37, emb_name="clash_emb.safetensors", base=None))
    broken = {
        "no-clip-g": embeddings_file(pipe, seed=40, clip_g=None),
        "wide": embeddings_file(pipe, seed=41, clip_l=torch.zeros(2, 48)),
        "ragged": embeddings_file(pipe, seed=42, clip_g=torch.zeros(3, 32)),
        "nan": embeddings_file(pipe, seed=43, clip_l=torch.full((2, 32), float("nan"))),
        "not-safetensors": b"\x80\x04not safetensors",
        "padded": embeddings_file(pipe, seed=44, padding=torch.zeros(2**18)),
    }
    for role, data in broken.items():
        repo = pivotal_repo(pipe, seed=45, emb_name="embeddings.safetensors", base=None)
        add(f"bad-{role}", {**repo, "embeddings.safetensors": data})

    local_dir.mkdir(parents=True, exist_ok=True)
    current = files["current"]
    (local_dir / "mine.safetensors").write_bytes(current[WEIGHTS])
    (local_dir / "mine_emb.safetensors").write_bytes(current["current_emb.safetensors"])
    (local_dir / "run").mkdir(exist_ok=True)
    (local_dir / "run" / WEIGHTS).write_bytes(files["legacy"][WEIGHTS])
    (local_dir / "run" / "embeddings.safetensors").write_bytes(files["legacy"]["embeddings.safetensors"])
    (local_dir / "plain.safetensors").write_bytes(peft_file(pipe, seed=46))
    local = {"current": "local:mine.safetensors", "legacy": f"local:run/{WEIGHTS}", "plain": "local:plain.safetensors"}
    return PivotalFixtures(repos=repos, local_dir=local_dir, local=local, files=files)
