"""llama.cpp's greedy ids as a correctness reference, and our top-1 agreement with them (bench/gemma.py on Gemma 3
270M, bench/quality.py --llamacpp on the default model): a llama-server on the GGUF file (else llama-cpp-python's
loop) gives its greedy ids with each pick's top-1 margin; ours are taken teacher-forced on those ids, and every
place they split is named with both sides' margins, a near-tie (either engine may break it either way) or not.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from bench import llamacpp
from engine import Engine

NEAR_TIE = 1.0  # logits: a split where either side's top-1 margin is below this is a near-tie, not a bug


def reference_missing() -> str | None:
    """Why llama.cpp's greedy ids cannot be had here (None: they can): no llama-server (bench.llamacpp.server_binary)
    and no llama-cpp-python."""
    if llamacpp.server_binary() is not None or llamacpp.unavailable() is None:
        return None
    return (f"neither llama-server ({llamacpp.prefix() / 'bin' / 'llama-server'}; or set LLAMA_SERVER) nor "
            f"{llamacpp.unavailable()}")


def top_margin(entry: dict) -> float | None:
    """llama-server's top-1 margin in logits at one generated token: the two best log-probabilities' difference
    (a softmax shares its denominator, so it is the logits' difference), from either response shape it has used."""
    if "top_logprobs" in entry:
        lp = sorted((t["logprob"] for t in entry["top_logprobs"]), reverse=True)
    else:
        lp = sorted((math.log(max(t["prob"], 1e-45)) for t in entry.get("probs", [])), reverse=True)
    return lp[0] - lp[1] if len(lp) >= 2 else None


def server_greedy(root: str, prompt: list[int], new_tokens: int) -> dict:
    """llama.cpp's greedy ids and each pick's top-1 margin, from a running llama-server (the ids as they are: no
    <bos> added, no cached prefix, no stop at end of text)."""
    import httpx

    body = dict(prompt=prompt, n_predict=new_tokens, temperature=0.0, top_k=1, n_probs=2, cache_prompt=False,
                ignore_eos=True, return_tokens=True, seed=0)
    r = httpx.post(root + "/completion", json=body, trust_env=False, timeout=300)
    r.raise_for_status()
    out = r.json()
    probs = out["completion_probabilities"]
    if "tokens" not in out:
        return dict(ids=[int(p["id"]) for p in probs], margins=[top_margin(p) for p in probs], eos_banned=True)
    # every generated id is in `tokens`; a token that ends inside a UTF-8 character has no probability entry (on a
    # random-weight Q3_K_M file, 58 entries for 64 tokens: ids read from the entries put llama.cpp's later picks a
    # token early, and every one after the gap read as a split), so the entries are matched to the ids in order
    ids, margins, k = [int(t) for t in out["tokens"]], [], 0
    for t in ids:
        hit = k < len(probs) and int(probs[k]["id"]) == t
        margins.append(top_margin(probs[k]) if hit else None)
        k += hit
    return dict(ids=ids, margins=margins, eos_banned=True)


def reference(gguf_file: Path, threads: int):
    """A context manager giving greedy(prompt, new_tokens) -> {ids, margins} from llama.cpp on the file: a
    llama-server started with an empty environment but PATH and HOME (nothing torch or our engine set reaches it),
    f32 KV cache, flash attention off; else llama-cpp-python's loop."""
    from contextlib import contextmanager

    from engine.endpoint.llamacpp import LlamaServer

    @contextmanager
    def server():
        srv = LlamaServer(gguf_file, threads=threads, ctx=1024, exe=str(exe),
                          extra=["-ctk", "f32", "-ctv", "f32", "-fa", "off"])
        srv.args = ["env", "-i", f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}", f"HOME={Path.home()}", *srv.args]
        with srv:
            yield lambda prompt, n: server_greedy(srv.root, prompt, n)

    @contextmanager
    def loop():
        yield lambda prompt, n: llamacpp.time_decode(gguf_file, prompt, n, threads, repeats=1)

    exe = llamacpp.server_binary()
    return server() if exe is not None else loop()


@torch.inference_mode()
def agreement(eng: Engine, prompt: list[int], theirs: dict) -> tuple[float, list[dict]]:
    """Teacher-forced top-1 agreement: our argmax after each prefix of llama.cpp's ids, against its next id; and
    each position where they differ, with our top-1 margin there (our top logit over our logit of llama.cpp's
    pick) and llama.cpp's own top-1 margin there. Where the reference ran with ignore_eos (llama-server's, which
    bans the model's end tokens from its picks: server_greedy), ours leaves them out too: a place where the model
    would stop is not a disagreement."""
    ids = theirs["ids"]
    rows = eng.logits(prompt + ids[:-1])[len(prompt) - 1:].float()
    if theirs.get("eos_banned"):
        rows[:, list(eng.model.eos_ids)] = float("-inf")
    ours = rows.argmax(-1)
    splits = []
    for i in (ours != torch.tensor(ids)).nonzero().flatten().tolist():
        their_margin = theirs["margins"][i] if i < len(theirs["margins"]) else None
        splits.append(dict(at=i, ours=int(ours[i]), theirs=ids[i], our_margin=float(rows[i].max() - rows[i, ids[i]]),
                           llamacpp_margin=their_margin))
    return 1 - len(splits) / len(ids), splits


def near_tie(split: dict) -> bool:
    """A split either engine could have broken either way: one side's top-1 margin is within NEAR_TIE."""
    margins = [m for m in (split["our_margin"], split["llamacpp_margin"]) if m is not None]
    return bool(margins) and min(margins) < NEAR_TIE
