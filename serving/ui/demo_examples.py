"""The offline demo's examples under LoRA 1 (`serving.demo.example.demo_examples`): a schedule, an edit from two
references and a video, each filling the form with its LoRA and setting the base filter to that LoRA's base, so
the form shows its pool's controls (the video's frames, the reference slots) as a click on that base does.

Shown where the app serves the example's base (the offline demo's pools, loading ones included); a clicked example
fills the form and runs nothing (the newcomer presses Generate).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gradio as gr

from engine.settings import DEMO_LATER_POOLS, DEMO_POOLS
from serving.demo.example import DemoExample, demo_examples

if TYPE_CHECKING:  # engine.outcomes imports torch: `import app` loads no model library (tests/serving/test_start.py)
    from engine.outcomes import ServedPool

__all__ = ["examples_for", "render_examples"]


def examples_for(pools: Sequence[ServedPool], slots: int) -> tuple[DemoExample, ...]:
    """The demo's examples this app can run: their LoRA's base served (by that id: the demo's own LoRA files are
    the local catalogue's only there), and as many reference slots as an edit's images after the first."""
    served = {pool.base_model_id for pool in pools}
    # Only the demo's pools have them: elsewhere the LoRA tables (beside their makers: torch) are not imported.
    if not served & {pool.base_model_id for pool in (*DEMO_POOLS, *DEMO_LATER_POOLS)}:
        return ()
    return tuple(e for e in demo_examples() if e.lora.base in served and len(e.images[1:]) <= slots)


def render_examples(examples: Sequence[DemoExample], fields: dict[str, Any], accordion: gr.Accordion) -> None:
    """Each example as a `gr.Examples` over the form's components by name (`fields`: the names
    `DemoExample.form_values` uses; `references` a list of the slots); an example with images opens the "Start from
    an image" panel (`accordion`) that shows them."""
    for example in examples:
        values = example.form_values()
        references = values.pop("references", [])
        names = list(values)
        components = [fields[name] for name in names] + list(fields["references"][: len(references)])
        shown = gr.Examples(
            [[values[name] for name in names] + references],
            components,
            label=example.label,
            cache_examples=False,
            api_visibility="private",
            elem_id=example.elem_id,
        )
        if example.images:
            shown.load_input_event.then(
                lambda: gr.Accordion(open=True), None, accordion, api_visibility="private", queue=False
            )
