"""The prompts the page offers: one per mode where that mode does best, each at its best settings, written for
what the model is. An instruct model (its file has a chat template) gets requests it answers in a chat turn; a
base model (no chat template: Gemma 3 270M's file) continues text, so it gets openings to complete.

The page opens with the first of them filled in (an edit whose answer repeats its input, n-gram lookup at the
default k): a first Generate shows accepted drafts streaming in, which is what the page is for. An example that
does not beat plain decoding on this machine is not offered, with the reason shown (ui/example_check.py).
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
# A base model's: text to continue. A fact for plain decoding; the n-gram one is a pattern its continuation
# repeats (the next function of a family), the prose one an opening, the code one a signature and docstring.
BASE_PROSE = ("The old lighthouse stood at the edge of the cliff. Every night its lamp turned slowly, sweeping "
              "the dark water with a long beam of light. One morning the keeper found a bottle on the rocks, and")
BASE_FACT = "The capital of France is"
BASE_CODE = 'def is_prime(n: int) -> bool:\n    """Return True if n is a prime number.\n\n    >>> is_prime(7)\n'
BASE_REPEAT = ('def area_of_square(side):\n    """Return the area of a square with the given side."""\n'
               "    return side * side\n\n\n"
               'def area_of_rectangle(width, height):\n    """Return the area of a rectangle with the given width '
               'and height."""\n    return width * height\n\n\n'
               'def area_of_triangle(base, height):\n')
INSTRUCT_WORDS = dict(repeat="quote and edit", prose="prose", code="code")  # what each example's label says
BASE_WORDS = dict(repeat="continue a pattern", prose="continue prose", code="complete code")
FIRST_MODE = "n-gram"  # the mode the page opens with, the first example's (at the record's default k)
BASE_NOTE = ("{model} is a base model (its file carries no chat template): it continues the prompt's text rather "
             "than answering it, so the chat template is off and the examples are openings to complete.")


def is_base(rt: Runtime) -> bool:
    """A base model: its file has no chat template, so a prompt is text to continue, not a turn to answer."""
    return rt.tokenizer.chat_template is None


def base_note(rt: Runtime) -> str:
    """One line on the page saying what a base model does with a prompt ("" for an instruct model)."""
    return BASE_NOTE.format(model=rt.model_name) if is_base(rt) else ""


def examples(rt: Runtime) -> tuple[list[list], list[str]]:
    """A prompt per mode where that mode does best, each at its best settings (k is the most a round drafts;
    the schedule drafts less, or not at all, where drafting does not pay on this machine): an edit whose answer
    repeats its input for n-gram lookup, prose for the model's own quantized copy or a draft model, code for
    layer skipping over a set calibrated on the prompt. Rows: prompt, mode, k, layers, weights.

    The weights are the target's: n-gram drafts cost nothing, so it runs the launch format (the fastest);
    the model drafters draft for a target whose verify pass costs about one step, which on a CPU means a
    dense format (fp32: a 6-token verify pass ~1.05 steps; q4 needs T FMAs per weight and pays ~2.4), and
    self-draft needs a target that reads more bytes a weight than its drafts. These are the candidates:
    offered() keeps those that beat plain decoding here."""
    base = is_base(rt)
    repeat, prose, code = (BASE_REPEAT, BASE_PROSE, BASE_CODE) if base else (EDIT, PROSE, CODE)
    say = BASE_WORDS if base else INSTRUCT_WORDS
    formats = [f for f, why in rt.formats().items() if why is None]
    dense = next((f for f in ("fp32", "bf16", "fp16") if f in formats), rt.weight_format)
    targets = rt.self_draft_targets()
    self_target = dense if dense in targets else next(iter(targets), dense)
    rows = [[repeat, FIRST_MODE, SPECS["k"].default, CALIBRATED, rt.weight_format],
            [prose, "self-draft", 6, CALIBRATED, self_target], [code, "layer-skip", 4, CALIBRATED, dense]]
    labels = [f"n-gram: {say['repeat']}", f"self-draft ({rt.self_draft_format} drafts, {self_target} target): "
              f"{say['prose']}", f"layer-skip (calibrated, {dense}): {say['code']}"]
    if rt.drafts:
        rows.append([prose, "draft model", 5, CALIBRATED, rt.weight_format])
        labels.append(f"draft model: {say['prose']}")
    if base:  # what a base model is for, as it is: plain decoding, nothing to beat
        rows.append([BASE_FACT, "plain", SPECS["k"].default, CALIBRATED, rt.weight_format])
        labels.append("plain: complete a fact")
    available = [m for m, why in rt.modes().items() if why is None]
    keep = [i for i, row in enumerate(rows) if row[1] in available]
    return [rows[i] for i in keep], [labels[i] for i in keep]


def offered(rt: Runtime) -> tuple[list[list], list[str], str]:
    """The examples the page offers for this model on this machine, and a line naming each one left out with its
    measured reason ("" when all are offered, or when no check was made: then all are). rt.example_checks holds
    ui/example_check.py's verdicts by label."""
    rows, labels = examples(rt)
    checks = rt.example_checks
    keep = [i for i, label in enumerate(labels) if checks.get(label) is None or checks[label].offered]
    left = [f"{labels[i]}: {checks[labels[i]].reason}" for i in range(len(labels)) if i not in keep]
    note = ("Not offered on this machine: " + "; ".join(left) + ".") if left else ""
    return [rows[i] for i in keep], [labels[i] for i in keep], note
