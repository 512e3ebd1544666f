"""Speculative decoding: a drafter proposes, the target verifies in one pass, and the output is the text plain
decoding gives with the same seed (draws keyed by output position; loop.py proves it).

    loop.py        the draft -> verify -> accept loop (stream, generate) and the acceptance step
    schedule.py    the adaptive draft length: each round's k from the run's measured costs and acceptance
    lookup.py      prompt lookup (n-gram): copies from the prompt and the output, for answers that quote their input
    suffix.py      a session's earlier outputs, indexed for the lookup to copy from
    drafters.py    the drafter protocol, and a second model (a smaller one, or the target in a cheaper format)
    layerskip.py   self-speculation: the target with some of its layers left out
    selfdraft.py   self-drafting: a cheaper copy of the target's weights, or its layers skipped, by measured cost
"""
from engine.speculative.drafters import Draft, Drafter, ModelDrafter
from engine.speculative.layerskip import LayerSkipDrafter
from engine.speculative.lookup import NgramDrafter
from engine.speculative.loop import K_DEFAULT, K_MAX, accept, check_k, generate, stream
from engine.speculative.schedule import Schedule
from engine.speculative.selfdraft import self_drafter
from engine.speculative.suffix import SessionIndex

__all__ = ["K_DEFAULT", "K_MAX", "accept", "check_k", "stream", "generate", "Draft", "Drafter", "NgramDrafter",
           "ModelDrafter", "LayerSkipDrafter", "Schedule", "SessionIndex", "self_drafter"]
