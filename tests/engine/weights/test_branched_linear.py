"""`BranchedLinear` on the CPU, eager: its widening is torch's own fp8 conversion times the row scale, bit for bit,
on every finite e4m3 code (quantizing writes no other), and in float16 torchao's own with float32 row scales; the
plain (GPU) formula holds one copy of the weight and skips the branch at rank 0; its output is PEFT's unfused LoRA
on that weight; the weight is widened a block of rows at a time (never whole), and a swap's copies run on the
calling thread (each under torch's parallel grain)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from engine.weights.quantized import DEQUANTIZED_COPIES, BranchedLinear, _quantize

pytest.importorskip("torchao")

ROWS, COLUMNS = 1200, 96  # 1200 output rows: two full blocks of 512 and a partial one
GRAIN = 32768  # torch's at::internal::GRAIN_SIZE: a CPU op on fewer values runs on the calling thread


class Outputs(TorchDispatchMode):
    """The number of values each aten op (by name) writes: its result, views left out; `writes`: in place only."""

    def __init__(self, writes: bool = False) -> None:
        super().__init__()
        self.writes = writes
        self.sizes: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        result = func(*args, **(kwargs or {}))
        kept = func._schema.is_mutable if self.writes else not func.is_view
        if kept and isinstance(result, torch.Tensor):
            self.sizes.append((str(func), result.numel()))
        return result


def every_code(rows: int, columns: int) -> torch.Tensor:
    """Every e4m3 byte but the two NaNs (zeros, negative zero, subnormals, ±448), repeated to `rows` x `columns`."""
    codes = torch.tensor([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=torch.uint8)
    return codes.repeat(rows * columns // len(codes) + 1)[: rows * columns].view(rows, columns)


def branched(dtype: torch.dtype, bias: bool, rank: int = 8) -> BranchedLinear:
    torch.manual_seed(0)
    linear = nn.Linear(COLUMNS, ROWS, bias=bias).to(dtype)
    module = BranchedLinear(linear, rank, dtype)
    module.weight = nn.Parameter(every_code(ROWS, COLUMNS).view(torch.float8_e4m3fn), requires_grad=False)
    return module


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_widening_is_torchs_fp8_conversion_times_the_row_scale_bit_for_bit(dtype):
    module = branched(dtype, bias=False)
    reference = module.weight.to(dtype) * module.weight_scale.to(dtype)
    assert torch.equal(module.dequantized(dtype).view(torch.uint8), reference.view(torch.uint8))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_output_is_peft_unfused_on_the_same_weight(dtype, bias):
    from peft import LoraConfig, inject_adapter_in_model

    module = branched(dtype, bias)
    generator = torch.Generator().manual_seed(1)
    down, up = torch.randn(4, COLUMNS, generator=generator), torch.randn(ROWS, 4, generator=generator) * 0.1
    module.load_branch([(down.to(dtype), up.to(dtype), 0.5)])
    plain = nn.Linear(COLUMNS, ROWS, bias=bias, dtype=dtype)
    with torch.no_grad():
        plain.weight.copy_(module.weight.to(dtype) * module.weight_scale.to(dtype))
        if bias:
            plain.bias.copy_(module.bias)
    holder = nn.Sequential()
    holder.add_module("proj", plain)
    peft = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=2, target_modules=["proj"]), holder)
    with torch.no_grad():
        peft.proj.lora_A["default"].weight.copy_(down.to(dtype))
        peft.proj.lora_B["default"].weight.copy_(up.to(dtype))
        x = torch.randn(2, 5, COLUMNS, generator=generator).to(dtype)
        ours, theirs = module(x), peft(x)
    assert ours.shape == (2, 5, ROWS)
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-4}
    torch.testing.assert_close(ours, theirs, **tolerance)


def test_the_eager_forward_never_widens_the_whole_weight_at_once():
    module = branched(torch.bfloat16, bias=True)
    module.load_branch([(torch.ones(2, COLUMNS, dtype=torch.bfloat16), torch.ones(ROWS, 2, dtype=torch.bfloat16), 1.0)])
    x = torch.randn(3, COLUMNS).to(torch.bfloat16)
    with torch.no_grad(), Outputs() as seen:
        module(x)
    largest = max(seen.sizes, key=lambda item: item[1])
    assert largest[1] < ROWS * COLUMNS, f"{largest[0]} made {largest[1]} values: the whole weight widened at once"


def test_a_swaps_copies_on_the_cpu_each_stay_under_torchs_parallel_grain():
    module = BranchedLinear(nn.Linear(64, 4096), 32, torch.float32)
    down, up = torch.randn(16, 64), torch.randn(4096, 16)  # up: 65536 values, twice the grain
    with Outputs(writes=True) as seen:
        module.load_branch([(down, up, 0.5)])
        module.load_branch([(down[:4], up[:, :4], 2.0)])  # zeroes ranks 4-15 of the rank-16 set before it
    assert seen.sizes and max(size for _, size in seen.sizes) <= GRAIN
    assert torch.equal(module.lora_down[:4], down[:4]) and torch.equal(module.lora_up[:, :4], up[:, :4])
    assert not module.lora_down[4:].any() and not module.lora_up[:, 4:].any() and module.branch_rank == 4


def fp16_linear(scale: float = 1.0) -> nn.Linear:
    torch.manual_seed(0)
    linear = nn.Linear(COLUMNS, ROWS).to(torch.float16)
    with torch.no_grad():
        linear.weight.mul_(scale)
    return linear


def matmuls(module: BranchedLinear, x: torch.Tensor) -> int:
    with torch.no_grad(), Outputs() as seen:
        module(x)
    return sum(name.split(".")[1] in ("mm", "addmm", "bmm") for name, _ in seen.sizes)


def test_float16_keeps_float32_row_scales_where_float16_would_round_them_to_subnormals():
    """Weights of about 1e-4 have row scales near 2e-7, under float16's smallest normal (6e-5): quantized from their
    float32 values and widened with float32 scales, the weight is torchao's own quantization of those values and its
    dequantization to float16 (a float32 product, rounded once), bit for bit; within e4m3's rounding of each row."""
    from torchao.quantization import Float8Tensor, PerRow

    linear = fp16_linear(scale=1e-3)
    weight = linear.weight.detach().clone()
    theirs = Float8Tensor.from_hp(weight.float(), float8_dtype=torch.float8_e4m3fn, granularity=PerRow())
    module = BranchedLinear(linear, 8, torch.float16)
    assert module.weight_scale.dtype == torch.float32 and module.weight_scale.max() < 2**-14
    assert torch.equal(module.weight, theirs.qdata) and torch.equal(module.weight_scale, theirs.scale)
    widened = module.dequantized(torch.float16)
    assert torch.equal(widened, theirs.dequantize(torch.float16))
    error = (widened.float() - weight.float()).abs().amax(dim=1) / weight.float().abs().amax(dim=1)
    assert error.max() <= 2**-4


def test_the_plain_formula_widens_one_copy_of_the_weight_and_skips_the_branch_at_rank_zero():
    """The GPU's (and compiled) formula, reached on the CPU in float16: one transient copy of the weight in the
    compute dtype (what the memory plan counts: DEQUANTIZED_COPIES), and no branch matmuls while no rank is held
    (a Python int: no device sync); with factors held, the branch runs at the padded rank."""
    module = BranchedLinear(fp16_linear(), 8, torch.float16)
    x = torch.randn(3, COLUMNS).to(torch.float16)
    with torch.no_grad(), Outputs() as seen:
        base = module(x)
    # New tensors of the weight's size (an op in place, `mul_`, makes none).
    copies = [name for name, size in seen.sizes if size == ROWS * COLUMNS and not name.split(".")[1].endswith("_")]
    assert len(copies) == DEQUANTIZED_COPIES, copies
    assert matmuls(module, x) == 1
    assert torch.equal(base, nn.functional.linear(x, module.dequantized(torch.float16), module.bias))
    down, up = torch.randn(2, COLUMNS).to(torch.float16), torch.randn(ROWS, 2).to(torch.float16) * 0.01
    module.load_branch([(down, up, 0.5)])
    assert matmuls(module, x) == 3
    module.load_branch([])
    assert module.branch_rank == 0 and matmuls(module, x) == 1


def test_quantizing_never_writes_the_nan_codes_the_cpus_bit_widening_reads_as_480():
    """The bit widening reads e4m3's two NaN codes as ±480·scale (their bits as if they were numbers); quantizing
    writes neither, whatever the rows: huge, tiny, mixed, or zeros, where torchao's scale is 0 and its values 0/0
    (NaN codes, NaN once dequantized): stored as zeros with scale 1, such a row is zeros on every path."""
    rows = torch.stack(
        [
            torch.full((COLUMNS,), 3e38),
            torch.linspace(-1e-30, 1e-30, COLUMNS),
            torch.zeros(COLUMNS),
            torch.randn(COLUMNS) * torch.logspace(-20, 20, COLUMNS),
        ]
    )
    values, _ = _quantize(rows)
    codes = values.view(torch.uint8)
    assert codes.shape == rows.shape and not ((codes == 0x7F) | (codes == 0xFF)).any()
    linear = nn.Linear(COLUMNS, 4).to(torch.float16)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(4, COLUMNS))
        linear.weight[2] = 0
    module = BranchedLinear(linear, 2, torch.float16)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert torch.equal(module.dequantized(dtype)[2], torch.zeros(COLUMNS, dtype=dtype))
    assert module(torch.ones(1, COLUMNS, dtype=torch.float16)).isfinite().all()
