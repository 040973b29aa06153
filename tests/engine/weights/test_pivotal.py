"""Pivotal-tuning LoRAs: their tokens against diffusers' own textual inversion, and the exact way back out."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import StableDiffusionXLPipeline
from huggingface_hub import hf_hub_download
from safetensors.torch import load_file

from engine.errors import AdapterLoadError, IncompatibleLoraError, InvalidRequestError, LimitExceededError
from engine.requests import GenerateRequest, LoraSpec
from engine.weights.tokens import TokenPatcher
from tests.support.checks import generate, raises_caused_by
from tests.support.images import assert_images_close
from tests.support.loras import PIVOTAL_PROMPT, WEIGHTS

ENCODERS = (("tokenizer", "text_encoder"), ("tokenizer_2", "text_encoder_2"))
PROMPT = f"{PIVOTAL_PROMPT}, a cat"


@pytest.fixture(scope="module")
def base_text(loaded):
    """The served tokenizers and embedding weights before any pivotal LoRA, to check restores against."""
    pipe = loaded.pipe
    return {
        tokenizer: (getattr(pipe, tokenizer), len(getattr(pipe, tokenizer)), getattr(pipe, encoder).config.vocab_size)
        for tokenizer, encoder in ENCODERS
    } | {encoder: getattr(pipe, encoder).get_input_embeddings().weight for _, encoder in ENCODERS}


@pytest.fixture
def engine(make_engine, pivotal):
    return make_engine(local_lora_dir=pivotal.local_dir)


def request(*loras: LoraSpec, seed: int = 7, prompt: str = PROMPT, steps: int = 3) -> GenerateRequest:
    return GenerateRequest(prompt=prompt, loras=tuple(loras), steps=steps, width=64, height=64, seed=seed)


def pixels(image) -> np.ndarray:
    return np.asarray(image, dtype=np.int16)


def generate_seeing(engine, pipe, one: GenerateRequest):
    """The result, and the tokenizers and embedding sizes the pipeline had while it ran (seen at each step)."""
    seen: list[tuple] = []

    def progress(step: int, steps: int) -> None:
        seen.append(
            tuple((getattr(pipe, t), getattr(pipe, e).get_input_embeddings().weight.shape[0]) for t, e in ENCODERS)
        )

    result = generate(engine, one, progress=progress)
    assert seen and all(s == seen[0] for s in seen)
    return result, seen[0]


def diffusers_image(tiny_dir, repo_id: str, weight_name: str, emb_name: str | None, tokens: list[str]):
    """The reference: diffusers' load_lora_weights + fuse_lora + load_textual_inversion for both encoders."""
    pipe = StableDiffusionXLPipeline.from_pretrained(tiny_dir)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(repo_id, weight_name=weight_name, use_safetensors=True)
    pipe.fuse_lora()
    if emb_name is not None:
        state = load_file(hf_hub_download(repo_id, emb_name))
        pipe.load_textual_inversion(
            state["clip_l"], token=tokens, text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer
        )
        pipe.load_textual_inversion(
            state["clip_g"], token=tokens, text_encoder=pipe.text_encoder_2, tokenizer=pipe.tokenizer_2
        )
    generator = torch.Generator("cpu").manual_seed(7)
    return pipe(prompt=PROMPT, num_inference_steps=3, width=64, height=64, generator=generator).images[0]


def text_state(pipe) -> tuple:
    """What the pipeline's tokenizers and embedding matrices are right now (objects, sizes, values)."""
    state = []
    for tokenizer, encoder in ENCODERS:
        weight = getattr(pipe, encoder).get_input_embeddings().weight
        state.append((getattr(pipe, tokenizer), len(getattr(pipe, tokenizer)), weight, weight.detach().clone()))
    return tuple(state)


def assert_same_text_state(pipe, before: tuple, *, same_weight_object: bool = True) -> None:
    """Same tokenizer objects and sizes, embedding matrices equal bit for bit (and the very same tensors)."""
    for (tokenizer, size, weight, values), now in zip(before, text_state(pipe), strict=True):
        assert now[0] is tokenizer and now[1] == size and torch.equal(now[3], values)
        assert now[2] is weight or not same_weight_object


def assert_base(pipe, base_text, pristine) -> None:
    """Tokenizers back to their original vocabulary, embeddings of original size, every weight bit-exact."""
    for tokenizer_name, encoder_name in ENCODERS:
        tokenizer, size, vocab_size = base_text[tokenizer_name]
        encoder = getattr(pipe, encoder_name)
        weight = encoder.get_input_embeddings().weight
        assert getattr(pipe, tokenizer_name) is tokenizer, f"{tokenizer_name} was not put back"
        assert len(tokenizer) == size and "<s0>" not in tokenizer.get_vocab()
        assert weight is base_text[encoder_name] and weight.shape[0] == size == vocab_size
        assert encoder.config.vocab_size == vocab_size
    for name in ("unet", "text_encoder", "text_encoder_2"):
        for key, value in getattr(pipe, name).state_dict().items():
            assert torch.equal(value, pristine[f"{name}.{key}"]), f"{name}.{key} drifted"


@pytest.mark.parametrize(
    ("role", "weight_name", "emb_name", "tokens"),
    [
        ("current", WEIGHTS, "current_emb.safetensors", ["<s0>", "<s1>"]),
        ("current", "current.safetensors", "current_emb.safetensors", ["<s0>", "<s1>"]),
        ("legacy", WEIGHTS, "embeddings.safetensors", ["<s0>", "<s1>", "<s2>"]),
    ],
)
def test_pivotal_lora_matches_diffusers_lora_plus_textual_inversion(
    engine, pivotal, tiny_dir, loaded, base_text, pristine, role, weight_name, emb_name, tokens
):
    spec = LoraSpec(pivotal[role], weight_name=weight_name if weight_name != WEIGHTS else None)
    ours = pixels(generate(engine, request(spec, prompt=PROMPT)).image)
    reference = pixels(diffusers_image(tiny_dir, pivotal[role], weight_name, emb_name, tokens))
    without = pixels(diffusers_image(tiny_dir, pivotal[role], weight_name, None, tokens))
    # Ten times the mean difference allowed between ours and the reference below.
    assert np.abs(reference - without).mean() > 1, "the fixture's tokens must visibly change the image"
    assert_images_close(ours, reference)
    assert np.abs(ours - reference).mean() < 0.1
    engine.close()
    assert_base(loaded.pipe, base_text, pristine)


def test_tokens_come_out_exactly_and_are_plain_text_again(engine, pivotal, loaded, base_text, pristine):
    pipe = loaded.pipe
    plain_before, seen = generate_seeing(engine, pipe, request())
    assert seen == tuple((base_text[t][0], base_text[t][1]) for t, _ in ENCODERS)
    assert len(pipe.tokenizer.tokenize("<s0>")) > 1, "without the LoRA <s0> is plain text"
    with_tokens, seen = generate_seeing(engine, pipe, request(LoraSpec(pivotal["current"])))
    for (tokenizer_name, encoder_name), (tokenizer, rows) in zip(ENCODERS, seen, strict=True):
        size = base_text[tokenizer_name][1]
        # During the run: a tokenizer that knows the tokens, and their rows right after the vocabulary.
        assert tokenizer is not base_text[tokenizer_name][0] and rows == size + 2
        assert tokenizer.convert_tokens_to_ids(["<s0>", "<s1>"]) == [size, size + 1]
        # After it: the base tokenizer object again; the rows stay while the set stays fused, never read by it.
        assert (
            getattr(pipe, tokenizer_name) is base_text[tokenizer_name][0] and len(getattr(pipe, tokenizer_name)) == size
        )
        assert getattr(pipe, encoder_name).get_input_embeddings().weight.shape[0] == size + 2
    plain_after = generate(engine, request())
    assert plain_after.swapped and with_tokens.image.tobytes() != plain_before.image.tobytes()
    assert plain_after.image.tobytes() == plain_before.image.tobytes()
    assert_base(pipe, base_text, pristine)


def test_same_pivotal_set_again_costs_nothing(engine, pivotal, loaded):
    first = generate(engine, request(LoraSpec(pivotal["current"])))
    state = text_state(loaded.pipe)
    second = generate(engine, request(LoraSpec(pivotal["current"]), seed=8))
    assert first.swapped and not second.swapped and second.timings.apply == 0.0
    assert [u.cache for u in (first.adapters[0], second.adapters[0])] == ["miss", "hit"]
    assert_same_text_state(loaded.pipe, state)


def test_with_a_plain_lora_and_back(engine, pivotal, fixtures, loaded, base_text, pristine):
    pipe = loaded.pipe
    both = generate(engine, request(LoraSpec(pivotal["current"]), LoraSpec(fixtures["peft"], scale=0.5)))
    only_pivotal, seen = generate_seeing(engine, pipe, request(LoraSpec(pivotal["current"])))
    assert both.swapped and only_pivotal.swapped and both.image.tobytes() != only_pivotal.image.tobytes()
    assert seen[0][0].convert_tokens_to_ids("<s1>") == base_text["tokenizer"][1] + 1
    _, seen = generate_seeing(engine, pipe, request(LoraSpec(fixtures["peft"]), seed=8))
    assert seen == tuple((base_text[t][0], base_text[t][1]) for t, _ in ENCODERS)
    generate(engine, request(LoraSpec(fixtures["peft"])))
    engine.close()
    assert_base(loaded.pipe, base_text, pristine)


@pytest.mark.parametrize("served", ["base", "current"])
def test_clashing_tokens_are_refused_and_change_nothing(engine, pivotal, loaded, served):
    if served == "current":
        generate(engine, request(LoraSpec(pivotal["current"])))
    before, applied = text_state(loaded.pipe), engine.status().applied
    for pair in (("current", "clash"), ("legacy", "current")):
        with pytest.raises(InvalidRequestError, match=r"both define the pivotal-tuning tokens <s0><s1>"):
            generate(engine, request(*(LoraSpec(pivotal[role]) for role in pair)))
        assert engine.status().applied == applied
        assert_same_text_state(loaded.pipe, before)


def test_failed_generation_restores_the_tokens_served_before(engine, pivotal, loaded, base_text, pristine, monkeypatch):
    real_call = type(loaded.pipe).__call__
    broken = {"on": True}
    used: list[object] = []

    def flaky_call(self, *args, **kwargs):
        used.append(self.tokenizer_2)
        if broken["on"]:
            raise RuntimeError("injected failure inside generation")
        return real_call(self, *args, **kwargs)

    monkeypatch.setattr(type(loaded.pipe), "__call__", flaky_call)
    with raises_caused_by("injected failure"):
        generate(engine, request(LoraSpec(pivotal["current"])))
    # The run failed with the token-aware tokenizer in place; the pipeline has the base one back.
    assert "<s1>" in used[-1].get_vocab()
    assert_base(loaded.pipe, base_text, pristine)
    broken["on"] = False
    served = generate(engine, request(LoraSpec(pivotal["current"])))
    state = text_state(loaded.pipe)
    broken["on"] = True
    with raises_caused_by("injected failure"):
        generate(engine, request(LoraSpec(pivotal["legacy"])))
    # Rolling back re-applies the served set: a new matrix equal bit for bit, the cached tokenizers.
    assert_same_text_state(loaded.pipe, state, same_weight_object=False)
    assert "<s2>" in used[-1].get_vocab()
    broken["on"] = False
    again = generate(engine, request(LoraSpec(pivotal["current"])))
    assert not again.swapped and again.image.tobytes() == served.image.tobytes()
    assert "<s1>" in used[-1].get_vocab() and "<s2>" not in used[-1].get_vocab()


def test_a_failure_on_the_second_encoder_leaves_neither_changed(
    engine, pivotal, loaded, base_text, pristine, monkeypatch
):
    # diffusers #6974: unloading left rows behind in text_encoder_2; here a failure half-way must not either.
    real_extend = TokenPatcher._extend  # private: the one step that writes an encoder's rows

    def failing_extend(self, index, rows):
        if index == 1:
            raise RuntimeError("injected failure extending text_encoder_2")
        real_extend(self, index, rows)

    monkeypatch.setattr(TokenPatcher, "_extend", failing_extend)
    with raises_caused_by("extending text_encoder_2"):
        generate(engine, request(LoraSpec(pivotal["current"])))
    assert_base(loaded.pipe, base_text, pristine)


def test_per_call_mode_takes_the_tokens_out_after_each_request(make_engine, pivotal, loaded, base_text, pristine):
    engine = make_engine(local_lora_dir=pivotal.local_dir, gpu_mode="per_call")
    first = generate(engine, request(LoraSpec(pivotal["current"])))
    assert_base(loaded.pipe, base_text, pristine)
    again = generate(engine, request(LoraSpec(pivotal["current"])))
    assert again.image.tobytes() == first.image.tobytes()


def test_local_pairs_by_the_naming_rule_apply_like_the_hub_repos(engine, pivotal, loaded, base_text, pristine):
    for role in ("current", "legacy"):
        hub_image = generate(engine, request(LoraSpec(pivotal[role]))).image.tobytes()
        local_image = generate(engine, request(LoraSpec(pivotal.local[role]))).image.tobytes()
        assert local_image == hub_image, role
    assert engine.check_lora(LoraSpec(pivotal.local["current"])).layers > 0
    plain = generate(engine, request(LoraSpec(pivotal.local["plain"])))
    assert plain.swapped
    assert_base_tokens_only(loaded.pipe, base_text)


def assert_base_tokens_only(pipe, base_text) -> None:
    for tokenizer_name, encoder_name in ENCODERS:
        assert getattr(pipe, tokenizer_name) is base_text[tokenizer_name][0]
        assert getattr(pipe, encoder_name).get_input_embeddings().weight is base_text[encoder_name]


def test_a_changed_local_embeddings_file_is_a_new_adapter(make_engine, pivotal, tmp_path):
    for name in ("mine.safetensors", "mine_emb.safetensors"):
        (tmp_path / name).write_bytes((pivotal.local_dir / name).read_bytes())
    engine = make_engine(local_lora_dir=tmp_path)
    spec = LoraSpec("local:mine.safetensors")
    first = generate(engine, request(spec))
    (tmp_path / "mine_emb.safetensors").write_bytes(pivotal.files["clash"]["clash_emb.safetensors"])
    changed = generate(engine, request(spec))
    assert changed.adapters[0].cache == "miss" and changed.image.tobytes() != first.image.tobytes()


@pytest.mark.parametrize(
    ("role", "error", "message"),
    [
        ("bad-no-clip-g", AdapterLoadError, r"has no tensor clip_g; accepted: tensors clip_l and clip_g"),
        ("bad-wide", IncompatibleLoraError, r"holds clip_l of shape \(2, 48\), clip_g of shape \(2, 32\)"),
        ("bad-ragged", IncompatibleLoraError, r"holds clip_l of shape \(2, 32\), clip_g of shape \(3, 32\)"),
        ("bad-nan", AdapterLoadError, r"NaN, infinite or non-float values"),
        ("bad-not-safetensors", AdapterLoadError, r"'embeddings.safetensors' is not a valid safetensors file"),
    ],
)
def test_broken_embeddings_files_are_refused_clearly(
    engine, pivotal, loaded, base_text, pristine, role, error, message
):
    generate(engine, request(LoraSpec(pivotal["current"])))
    before, applied = text_state(loaded.pipe), engine.status().applied
    with pytest.raises(error, match=message):
        generate(engine, request(LoraSpec(pivotal[role])))
    assert engine.status().applied == applied
    assert_same_text_state(loaded.pipe, before)
    assert all(c.key.name != pivotal[role] for c in engine.status().cached)


def test_an_oversize_embeddings_file_is_refused_before_download(make_engine, pivotal, clean_hub):
    sizes = {name: len(data) for name, data in pivotal.files["bad-padded"].items()}
    assert sizes[WEIGHTS] < 2**20 < sizes["embeddings.safetensors"]
    engine = make_engine(max_adapter_bytes=2**20)
    with pytest.raises(LimitExceededError, match=r"\(embeddings.safetensors\) is 1.00 MiB"):
        generate(engine, request(LoraSpec(pivotal["bad-padded"])))
    assert not any(r.path.endswith("embeddings.safetensors") for r in clean_hub.requests)


@pytest.mark.parametrize("steps", [60, pytest.param(400, marks=[pytest.mark.slow, pytest.mark.timeout(3600)])])
def test_long_mixed_run_leaves_tokenizers_embeddings_and_weights_exact(
    make_engine, pivotal, fixtures, loaded, base_text, pristine, monkeypatch, steps
):
    engine = make_engine(local_lora_dir=pivotal.local_dir)
    pipe = loaded.pipe
    base_image = generate(engine, request(steps=1)).image.tobytes()
    with_tokens = [pivotal["current"], pivotal["legacy"], pivotal.local["current"]]
    choices = [*with_tokens, fixtures["peft"], fixtures["kohya"], pivotal.local["plain"]]
    rng = np.random.default_rng(1)
    broken = {"on": False}
    real_call = type(pipe).__call__

    def flaky_call(self, *args, **kwargs):
        if broken["on"]:
            raise RuntimeError("injected failure inside generation")
        return real_call(self, *args, **kwargs)

    monkeypatch.setattr(type(pipe), "__call__", flaky_call)
    outcomes = {"served": 0, "failed": 0, "with tokens": 0}
    for step in range(steps):
        picked = [choices[i] for i in rng.choice(len(choices), size=int(rng.integers(0, 3)), replace=False)]
        loras = [LoraSpec(ref, scale=float(rng.choice([0.3, 0.7, 1.0, -0.5]))) for ref in picked]
        broken["on"] = step % 7 == 3
        if step % 13 == 6:
            loras.append(LoraSpec(pivotal["bad-nan"]))
        clash = sum(ref in with_tokens for ref in picked) > 1
        before, applied = text_state(pipe), engine.status().applied
        one_step = request(*loras, seed=step, steps=1)
        if broken["on"] or clash or step % 13 == 6:
            with raises_caused_by(r"injected failure|NaN|both define the pivotal-tuning tokens"):
                generate(engine, one_step)
            outcomes["failed"] += 1
            assert engine.status().applied == applied
            assert_same_text_state(pipe, before, same_weight_object=False)
        else:
            generate(engine, one_step)
            outcomes["served"] += 1
            outcomes["with tokens"] += any(ref in with_tokens for ref in picked)
    broken["on"] = False
    assert outcomes["failed"] > steps // 5 and outcomes["with tokens"] > steps // 6, outcomes
    engine.restore_base_weights()
    assert_base(pipe, base_text, pristine)
    assert generate(engine, request(steps=1)).image.tobytes() == base_image


def test_naming_the_embeddings_file_as_the_lora_is_refused(engine, pivotal):
    with pytest.raises(InvalidRequestError, match=r"'current_emb.safetensors' .* is a pivotal-tuning embeddings file"):
        generate(engine, request(LoraSpec(pivotal["current"], weight_name="current_emb.safetensors")))


def test_a_pivotal_lora_on_disk_serves_with_its_tokens_after_a_restart_without_the_hub(
    make_engine, pivotal, clean_hub, loaded
):
    first = make_engine()
    before = generate(first, request(LoraSpec(pivotal["current"])))
    first.close()  # the process "ends": nothing of it is left in memory for the next engine
    clean_hub.set_fault("down")
    restarted = make_engine()
    after, seen = generate_seeing(restarted, loaded.pipe, request(LoraSpec(pivotal["current"])))
    assert any("served from the local Hub cache" in w for w in after.warnings), after.warnings
    assert all("<s1>" in tokenizer.get_vocab() for tokenizer, _ in seen)
    assert after.image.tobytes() == before.image.tobytes()
