"""Speculative decoding: a drafter proposes, the target verifies in one pass, rejection sampling keeps the
output distributed exactly as plain decoding's.

    loop.py        the draft -> verify -> accept loop (stream, generate) and the acceptance step
    schedule.py    the adaptive draft length: each round's k from the run's measured costs and acceptance
    drafters.py    prompt lookup (n-gram) and a second model (a smaller one, or the target in a cheaper format)
    layerskip.py   self-speculation: the target with some of its layers left out
"""
from engine.speculative.drafters import Draft, Drafter, ModelDrafter, NgramDrafter, self_drafter
from engine.speculative.layerskip import LayerSkipDrafter
from engine.speculative.loop import K_MAX, accept, check_k, generate, stream
from engine.speculative.schedule import Schedule

__all__ = ["K_MAX", "accept", "check_k", "stream", "generate", "Draft", "Drafter", "NgramDrafter", "ModelDrafter",
           "LayerSkipDrafter", "Schedule", "self_drafter"]
