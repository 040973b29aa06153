"""The swap benchmark's parts on the tiny UNet, and (slow) the whole benchmark's quick run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.flux_slice import FLUX_SLICE_CONFIG, build_flux_slice, flux_targets, write_flux_pair
from bench.formats import measure_formats
from bench.measure import Clock
from bench.options import Options, parse_options
from bench.ours import KERNELS, Floor, Ours, write_pair
from bench.qwen_slice import QWEN_SLICE_CONFIG, build_qwen_slice, qwen_targets, write_qwen_pair
from bench.sdxl_unet import build_sdxl_unet, drift_from_fill, fill_module, mismatched_tensors, random_pool
from bench.sections import measure_ours, measure_reference
from bench.wan_slice import build_wan_slice, wan_targets, write_wan_pair
from engine.families.sdxl import build_tiny_pipeline
from serving.demo.synthetic import UNET_ATTENTION, find_targets

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
LAST_LINE = re.compile(
    r"^swap_vs_floor=(\d+\.\d+) swap_vs_reference=(\d+\.\d+) exact=(true|false) convert_trace_vs_plain=(\d+\.\d+)$"
)


@pytest.fixture(scope="module")
def tiny_config() -> dict:
    return dict(build_tiny_pipeline().unet.config)


@pytest.fixture(scope="module")
def pool() -> torch.Tensor:
    return random_pool(seed=3, size=1 << 18)


def tiny_unet(config: dict, pool: torch.Tensor, dtype: torch.dtype = torch.bfloat16):
    return build_sdxl_unet(dtype=dtype, pool=pool, config=config)


def options(**overrides) -> Options:
    defaults = dict(
        device=CPU,
        dtype=torch.bfloat16,
        ranks=(4,),
        formats=("peft", "kohya"),
        repeats=2,
        reference_repeats=1,
        leak_swaps=3,
        threads=None,
        quick=True,
        json_path=None,
        workdir=None,
    )
    return Options(**{**defaults, **overrides})


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int16) if tensor.element_size() == 2 else tensor.view(torch.int32)


def test_fill_is_deterministic_and_reaches_every_tensor(tiny_config, pool):
    first, second = tiny_unet(tiny_config, pool), tiny_unet(tiny_config, pool)
    pairs = list(zip(first.state_dict().items(), second.state_dict().items(), strict=True))
    assert all(torch.equal(bits(a), bits(b)) for (_, a), (_, b) in pairs)
    assert mismatched_tensors(first, pool) == []
    assert all(bool(t.ne(0).any()) for t in first.state_dict().values() if t.numel() > 1)
    queries = [m.to_q.weight for m in first.modules() if hasattr(m, "to_q")]
    assert len(queries) > 1 and not torch.equal(queries[0], queries[1]), "equal shapes must get different slices"


def test_a_one_ulp_change_is_found(tiny_config, pool):
    unet = tiny_unet(tiny_config, pool)
    weight = unet.down_blocks[1].attentions[0].transformer_blocks[0].attn2.to_k.weight
    with torch.no_grad():
        bits(weight).view(-1)[7] += 1
    changed = mismatched_tensors(unet, pool)
    largest, count = drift_from_fill(unet, pool)
    assert changed == ["down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight"]
    assert count == 1 and 0 < largest < 1e-3
    fill_module(unet, pool)
    assert mismatched_tensors(unet, pool) == []


def test_a_pool_smaller_than_a_tensor_is_refused(tiny_config):
    with pytest.raises(ValueError, match="does not fit a pool of 64; accepted: a larger pool"):
        tiny_unet(tiny_config, random_pool(size=64))


def test_floor_fuses_bit_identically_to_the_engine(tiny_config, pool, tmp_path):
    unet = tiny_unet(tiny_config, pool)
    targets = find_targets({"unet": unet}, {"unet": UNET_ATTENTION})
    pair = write_pair(tmp_path, targets, rank=4, fmt="kohya")
    ours = Ours(unet, device=CPU, dtype=torch.bfloat16, max_rank=8, cache_bytes=2**26)
    adapters = [ours.store.add(ours.prepare(path, path.stem)) for path in pair.paths]
    ours.swap(adapters[1])
    engine_fused = {i: ours.table.params[i].clone() for i in range(len(ours.table))}
    ours.reset()
    floor = Floor(ours.table.params, {layer.target for layer in adapters[0].layers})
    floor.swap(floor.factors(adapters[0]))
    floor.swap(floor.factors(adapters[1]))
    assert all(torch.equal(bits(p), bits(engine_fused[i])) for i, p in enumerate(ours.table.params))
    assert len(mismatched_tensors(unet, pool)) == len(adapters[1].layers)
    floor.restore()
    assert mismatched_tensors(unet, pool) == []


def test_floor_and_ours_taking_turns_leave_the_base_exact(tiny_config, pool, tmp_path):
    unet = tiny_unet(tiny_config, pool)
    targets = find_targets({"unet": unet}, {"unet": UNET_ATTENTION})
    opts = options()
    pairs = {(4, fmt): write_pair(tmp_path, targets, rank=4, fmt=fmt) for fmt in opts.formats}
    results = measure_ours(unet, pairs, opts, Clock(CPU), say=lambda _: None)
    assert mismatched_tensors(unet, pool) == []
    methods = {(r.fmt, r.method.strip()) for r in results.rows}
    for fmt in opts.formats:
        assert {(fmt, "(e) floor: fastest exact kernel"), (fmt, "(c) ours, cached adapter")} <= methods
        assert (fmt, "(d) ours, first-seen file") in methods
    assert all(r.n == opts.repeats for r in results.rows)
    assert results.interleaved == (4,)
    ((rank, kernel, timings),) = results.floor_kernels
    assert rank == 4 and kernel in KERNELS and kernel in timings
    assert results.rss is not None and results.rss.swaps == 3
    for use in results.memory:
        assert 0 < use.host_tier_bytes < use.file_bytes
        # float16 files, bfloat16 compute on the CPU: one copy, kept in the compute dtype (no device tier)
        assert use.host_ram_bytes == use.host_tier_bytes == use.device_tier_bytes


def test_reference_cycles_drift_in_bfloat16(tiny_config, pool, tmp_path):
    unet = tiny_unet(tiny_config, pool)
    targets = find_targets({"unet": unet}, {"unet": UNET_ATTENTION})
    opts = options(formats=("peft",))
    pairs = {(4, "peft"): write_pair(tmp_path, targets, rank=4, fmt="peft")}
    results = measure_reference(unet, pairs, opts, Clock(CPU), say=lambda _: None)
    largest, count = drift_from_fill(unet, pool)
    assert results.cycles == 2
    assert {r.method.strip() for r in results.rows} >= {"(a) reference cycle", "(a) fuse", "(b) diffusers hotswap"}
    assert count > 0 and largest > 0, "fusing and unfusing in bfloat16 is not expected to round-trip"


def test_lycoris_and_dora_swaps_take_turns_with_the_floor_and_leave_the_base_exact(tiny_config, pool, tmp_path):
    unet = tiny_unet(tiny_config, pool)
    targets = find_targets({"unet": unet}, {"unet": UNET_ATTENTION})
    opts = options(variants=("loha", "lokr", "dora"))
    results = measure_formats(unet, targets, tmp_path, opts, Clock(CPU), say=lambda _: None)
    assert mismatched_tensors(unet, pool) == []
    assert results.layers == len(targets[::4])
    for variant in opts.variants:
        methods = {r.method[:3]: r for r in results.rows if r.fmt == variant}
        assert set(methods) == {"(e)", "(c)", "(f)"}
        assert all(r.n == opts.repeats and min(r.samples_ms) > 0 for r in methods.values())
    for use in results.memory:
        # float32 ΔW per weight value against float16 factors of rank 4
        assert use.cached_bytes > use.factors_bytes > 0


def test_floor_kernels_reach_the_same_weights(tiny_config, pool, tmp_path):
    unet = tiny_unet(tiny_config, pool)
    targets = find_targets({"unet": unet}, {"unet": UNET_ATTENTION})
    pair = write_pair(tmp_path, targets, rank=4, fmt="peft")
    ours = Ours(unet, device=CPU, dtype=torch.bfloat16, max_rank=8, cache_bytes=2**26)
    adapter = ours.prepare(pair.paths[0], "a")
    floor = Floor(ours.table.params, {layer.target for layer in adapter.layers})
    factors = floor.factors(adapter)
    fused = {}
    for name in KERNELS:
        floor.kernel = name
        floor.swap(factors)
        fused[name] = [p.clone() for p in ours.table.params]
    floor.restore()
    first, *others = fused.values()
    assert all(torch.equal(bits(a), bits(b)) for other in others for a, b in zip(first, other, strict=True))
    assert floor.choose(factors, Clock(CPU)) in KERNELS and set(floor.timings) == set(KERNELS)
    assert mismatched_tensors(unet, pool) == []


# A FLUX transformer of FLUX.1's structure at a tiny width (the real-width slice is the benchmark's).
TINY_FLUX = {
    **FLUX_SLICE_CONFIG,
    "num_layers": 1,
    "num_single_layers": 1,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 32,
    "pooled_projection_dim": 32,
    "axes_dims_rope": (4, 6, 6),
}


def test_the_flux_sections_swap_exactly_and_match_diffusers_on_a_narrow_slice(pool, tmp_path):
    transformer = build_flux_slice(dtype=torch.bfloat16, device=CPU, pool=pool, config=TINY_FLUX)
    layers = flux_targets(transformer)
    assert {layer.name for layer in layers} >= {"double_blocks.0.img_attn.qkv", "single_blocks.0.linear1"}
    opts = options(family="flux")
    pairs = {(4, fmt): write_flux_pair(tmp_path, layers, rank=4, fmt=fmt) for fmt in opts.formats}
    results = measure_ours(transformer, pairs, opts, Clock(CPU), say=lambda _: None)
    assert mismatched_tensors(transformer, pool) == []
    assert {r.method.strip() for r in results.rows} >= {"(e) floor: fastest exact kernel", "(c) ours, cached adapter"}
    # diffusers' kohya converter splits linear1 at FLUX.1's widths only: at this width the reference reads the
    # diffusers-named files (the real-width run reads both).
    reference = measure_reference(
        transformer,
        {(4, "peft"): pairs[(4, "peft")]},
        options(family="flux", formats=("peft",)),
        Clock(CPU),
        say=lambda _: None,
    )
    assert {r.method.strip() for r in reference.rows} >= {"(a) reference cycle", "(b) diffusers hotswap"}
    flux = parse_options(["--family", "flux"])
    assert (flux.ranks, flux.variants, flux.headline_rank, flux.formats) == ((16, 64), (), 64, ("peft", "kohya"))


TINY_QWEN = {**QWEN_SLICE_CONFIG, "num_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2}
TINY_QWEN |= {"joint_attention_dim": 32, "axes_dims_rope": (4, 6, 6)}


def test_the_qwen_image_sections_swap_exactly_and_match_diffusers_on_a_narrow_slice(pool, tmp_path):
    transformer = build_qwen_slice(dtype=torch.bfloat16, device=CPU, pool=pool, config=TINY_QWEN)
    targets = qwen_targets(transformer)
    assert len(targets) == 2 * 14 and ("transformer_blocks.1.txt_mod.1", 32, 192) in targets
    opts = options(family="qwen")
    pairs = {(4, fmt): write_qwen_pair(tmp_path, targets, rank=4, fmt=fmt) for fmt in opts.formats}
    results = measure_ours(transformer, pairs, opts, Clock(CPU), say=lambda _: None)
    assert mismatched_tensors(transformer, pool) == []
    assert {r.method.strip() for r in results.rows} >= {"(e) floor: fastest exact kernel", "(c) ours, cached adapter"}
    reference = measure_reference(transformer, pairs, opts, Clock(CPU), say=lambda _: None)
    assert {r.method.strip() for r in reference.rows} >= {"(a) reference cycle", "(b) diffusers hotswap"}
    qwen = parse_options(["--family", "qwen"])
    assert (qwen.ranks, qwen.variants, qwen.headline_rank, qwen.formats) == ((16, 64), (), 64, ("peft", "kohya"))


# Wan's 14B config, narrowed (2 heads of 16, every layer kept).
TINY_WAN = {"num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 16, "ffn_dim": 48, "text_dim": 24}
TINY_WAN |= {"freq_dim": 16, "in_channels": 4, "out_channels": 4}


def test_the_wan_sections_swap_exactly_and_match_diffusers_on_a_narrow_slice(pool, tmp_path):
    transformer = build_wan_slice(dtype=torch.bfloat16, device=CPU, pool=pool, config=TINY_WAN)
    targets = wan_targets(transformer)
    assert len(targets) == 2 * 10 and ("blocks.1.ffn.net.0.proj", "blocks.1.ffn.0", 32, 48) in targets
    opts = options(family="wan")
    pairs = {(4, fmt): write_wan_pair(tmp_path, targets, rank=4, fmt=fmt) for fmt in opts.formats}
    results = measure_ours(transformer, pairs, opts, Clock(CPU), say=lambda _: None)
    assert mismatched_tensors(transformer, pool) == []
    assert {r.method.strip() for r in results.rows} >= {"(e) floor: fastest exact kernel", "(c) ours, cached adapter"}
    reference = measure_reference(transformer, pairs, opts, Clock(CPU), say=lambda _: None)
    assert {r.method.strip() for r in reference.rows} >= {"(a) reference cycle", "(b) diffusers hotswap"}
    wan = parse_options(["--family", "wan"])
    assert (wan.ranks, wan.variants, wan.headline_rank) == ((16, 64), (), 64)


def test_the_a14b_pair_swaps_both_narrow_slices_exactly_against_two_floors_and_diffusers(pool, tmp_path, capsys):
    from bench.swap_pair import run_pair

    opts = options(family="wan", pair=True, ranks=(4,), formats=("peft",))
    lines: list[str] = []
    result = run_pair(opts, lines.append, lambda: "load n/a", pool=pool, config=TINY_WAN)
    assert result["exact"] is True and result["swap_vs_floor"] > 0
    row = result["rows"]["r4-peft"]
    assert row["floor_high_ms"] > 0 and row["floor_low_ms"] > 0 and row["reference_ms"] > 0
    assert re.fullmatch(r"swap_vs_floor=\d+\.\d+ swap_vs_reference=\d+\.\d+ exact=true", lines[-1]), lines[-1]
    assert parse_options(["--family", "wan", "--pair"]).pair
    with pytest.raises(SystemExit):
        parse_options(["--family", "flux", "--pair"])
    assert "accepted: --pair with --family wan" in capsys.readouterr().err


def test_quick_defaults_and_bad_arguments(capsys):
    quick = parse_options(["--quick"])
    assert (quick.ranks, quick.repeats, quick.reference_repeats, quick.leak_swaps) == ((8,), 3, 1, 20)
    default = parse_options([])
    assert (default.ranks, default.variants, default.repeats, default.full) == (
        (8, 32),
        ("loha", "lokr", "dora"),
        4,
        False,
    )
    full = parse_options(["--full", "--variants", ""])
    assert (full.ranks, full.repeats, full.reference_repeats, full.variants) == ((8, 32, 128), 7, 3, ())
    chosen = parse_options(["--ranks", "8,32,32", "--formats", "kohya", "--dtype", "float32"])
    assert (chosen.ranks, chosen.formats, chosen.dtype, chosen.headline_rank) == (
        (8, 32),
        ("kohya",),
        torch.float32,
        32,
    )
    with pytest.raises(SystemExit):
        parse_options(["--ranks", "0,8"])
    assert "accepted: positive integers like 8,32,128" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_options(["--formats", "peft,lycoris"])
    assert "accepted: peft,kohya" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_options(["--family", "flux", "--variants", "loha"])
    assert "accepted: none (no LyCORIS on FLUX)" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_quick_benchmark_ends_with_the_verdict_line():
    done = subprocess.run(
        [sys.executable, "-m", "bench.swap", "--quick"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    last = done.stdout.strip().splitlines()[-1]
    match = LAST_LINE.match(last)
    assert match, f"unexpected last line: {last!r}"
    assert match[3] == "true", done.stdout[-4000:]
    assert float(match[4]) > 0, last
