"""The UI's API panel: working `gradio_client` and `curl` examples for this server, at the URL clients reach it."""

from __future__ import annotations

from collections.abc import Mapping

from engine.requests import ModelDefaults

__all__ = ["api_snippets", "base_url"]


def api_snippets(url: str, example_lora: str, defaults: ModelDefaults) -> str:
    """Working `gradio_client` and `curl` examples for the server at `url`."""
    client = f"""```python
from gradio_client import Client

client = Client("{url}")
image_path, info = client.predict(
    prompt="an elephant in the savanna",
    negative_prompt="",
    lora="{example_lora}",
    lora_scale=1.0,
    lora_2="",
    lora_2_scale=1.0,
    steps={defaults.steps},
    guidance={defaults.guidance:g},
    width={defaults.side},
    height={defaults.side},
    seed=-1,  # -1 picks a random seed; info["seed"] says which
    scheduler="",  # a sampler: "Euler a", "DPM++ 2M Karras", "LCM", ... ("" = the LoRA's or the model's)
    clip_skip=0,  # text-encoder layers skipped, as diffusers counts them (A1111's "Clip skip 2" is 1)
    api_name="/generate",
)
# 1 to 4 images with consecutive seeds: [{{"image": path, "caption": "seed N"}}, ...]
images, info = client.predict(prompt="an elephant", lora="{example_lora}", num_images=4, api_name="/generate_images")
page = client.predict(base="", search="", sort="downloads", page=0, api_name="/catalog")
lora = client.predict(repo_id="{example_lora}", revision="", weight_name="", api_name="/lora_info")
# A comparison: one seed, a sweep of one LoRA's scale (or several LoRAs, one per line), the base first.
grid_path, cells, info = client.predict(
    prompt="an elephant in the savanna",
    negative_prompt="",
    loras="{example_lora}",
    scales="0, 0.5, 1",
    include_base=True,
    steps={defaults.steps},
    guidance={defaults.guidance:g},
    width={defaults.side},
    height={defaults.side},
    seed=-1,
    api_name="/compare",
)
```"""
    body = f'{{"inputs": "an elephant", "parameters": {{"num_inference_steps": {defaults.steps}}}}}'
    curl = f"```bash\ncurl -H 'lora: {example_lora}' {url} \\\n     -d '{body}' > result.jpg\n```"
    notes = (
        "Parameters: `num_inference_steps`, `guidance_scale`, `negative_prompt`, `width`, `height`, `seed`, "
        "`lora_scale`, `loras`, `scheduler` (a sampler name or a diffusers scheduler class), `scheduler_options` "
        '(e.g. `{"use_karras_sigmas": true}`), `clip_skip`. Images carry their recipe (A1111\'s `parameters`). '
        'Send `Accept: image/png` for a PNG. Errors are JSON `{"error": ..., "error_type": ...}` '
        "with status 400 (bad input or incompatible LoRA), 403 (gated), 404 (unknown LoRA), 503 (busy or Hub "
        "unreachable) or 500."
    )
    return (
        f"**Python** (`pip install gradio_client`)\n\n{client}\n\n**HTTP**, like the inference API\n\n{curl}\n\n{notes}"
    )


def base_url(headers: Mapping[str, str]) -> str:
    """The URL clients reach this server at, from the request's (possibly proxied) headers."""
    host = headers.get("x-forwarded-host") or headers.get("host") or "localhost:7860"
    host = host.split(",")[0].strip()
    proto = headers.get("x-forwarded-proto") or ("https" if host.endswith(".hf.space") else "http")
    return f"{proto.split(',')[0].strip()}://{host}/"
