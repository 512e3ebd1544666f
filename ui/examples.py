"""The prompts the page offers: one per mode where that mode does best, each at its best settings.

The page opens with the first of them filled in (an edit whose answer repeats its input, n-gram lookup at the
default k): a first Generate shows accepted drafts streaming in, which is what the page is for.
"""
from __future__ import annotations

from ui.runtime import Runtime
from engine.request import CALIBRATED, SPECS

PROSE = "Write a short, vivid paragraph about a lighthouse keeper who finds a message in a bottle."
CODE = "Write a Python function `is_prime(n: int) -> bool` with a docstring and a few doctest examples."
EDIT = ("Repeat the following text exactly, but fix its three spelling mistakes:\n\n"
        "The old lighthouse stood at the edge of the cliff. Every nigt its lamp turned slowly, sweeping the "
        "dark water with a long beam of light. Ships that passed far out at sea could see it for miles, and "
        "sailors knew that the rocks were close. The keeper climbed the stairs each evening, cleaned the "
        "glass, and wound the clockwork that turned the lens. He wrote the weather in his log book, the "
        "direction of the wind and the heigt of the waves, and he never mised a single night.")
FIRST_MODE = "n-gram"  # the mode the page opens with, the first example's (at the record's default k)


def examples(rt: Runtime) -> tuple[list[list], list[str]]:
    """A prompt per mode where that mode does best, each at its best settings (k is the most a round drafts;
    the schedule drafts less, or not at all, where drafting does not pay on this machine): an edit whose answer
    repeats its input for n-gram lookup, prose for the model's own quantized copy or a draft model, code for
    layer skipping over a set calibrated on the prompt. Rows: prompt, mode, k, layers, weights.

    The weights are the target's: n-gram drafts cost nothing, so it runs the launch format (the fastest);
    the model drafters draft for a target whose verify pass costs about one step, which on a CPU means a
    dense format (fp32: a 6-token verify pass ~1.05 steps; q4 needs T FMAs per weight and pays ~2.4), and
    self-draft needs a target that reads more bytes a weight than its drafts."""
    formats = [f for f, why in rt.formats().items() if why is None]
    dense = next((f for f in ("fp32", "bf16", "fp16") if f in formats), rt.weight_format)
    targets = rt.self_draft_targets()
    self_target = dense if dense in targets else next(iter(targets), dense)
    rows = [[EDIT, FIRST_MODE, SPECS["k"].default, CALIBRATED, rt.weight_format],
            [PROSE, "self-draft", 6, CALIBRATED, self_target], [CODE, "layer-skip", 4, CALIBRATED, dense]]
    labels = ["n-gram: quote and edit", f"self-draft ({rt.self_draft_format} drafts, {self_target} target): prose",
              f"layer-skip (calibrated, {dense}): code"]
    if rt.drafts:
        rows.append([PROSE, "draft model", 5, CALIBRATED, rt.weight_format])
        labels.append("draft model: prose")
    available = [m for m, why in rt.modes().items() if why is None]
    keep = [i for i, row in enumerate(rows) if row[1] in available]
    return [rows[i] for i in keep], [labels[i] for i in keep]
