"""CUDA graph capture of the whole decode step and of the fixed-size verify pass.

A decode step at batch 1 is hundreds of small kernels; launching them from Python costs more than
running them. A captured graph replays them with one launch. Shapes never depend on position (positions
come from cache.seq_lens on the device, attention masks by seq_lens, the fused decode kernel's split count
is sized for the cache's max), so one capture serves every length. A step is then a copy into the static
token buffer plus a replay; the only host sync stays the read of the sampled id.
"""
from __future__ import annotations

import time

import torch

WARMUP_ITERS = 3


class DecodeGraphs:
    """The decode-step graph, and one verify graph per chunk length T (captured on first use)."""

    def __init__(self, eng):
        self.eng = eng
        self.pool = torch.cuda.graph_pool_handle()
        self.capture_ms: dict[str, float] = {}
        self.step_tokens = torch.zeros(eng.cache.batch_size, dtype=torch.long, device=eng.device)
        self.step = self._capture("decode", lambda: eng.model(
            self.step_tokens[:, None], eng.cache, "decode", last_only=True))
        self.verify: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}

    def _capture(self, name: str, fn):
        """Warm up on a side stream (cuBLAS workspaces, allocator pools), then capture fn.

        Warm-up runs really execute: they write K/V at the current seq_lens (the positions the next real
        call overwrites) and advance seq_lens, which is restored afterwards."""
        t0 = time.perf_counter()
        saved = self.eng.cache.seq_lens.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_ITERS):
                fn()
                self.eng.cache.seq_lens.copy_(saved)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        self.eng.cache.seq_lens.copy_(saved)
        torch.cuda.synchronize()
        self.capture_ms[name] = (time.perf_counter() - t0) * 1e3
        return graph, out

    def decode(self, token: torch.Tensor) -> torch.Tensor:
        graph, logits = self.step
        self.step_tokens.copy_(token)
        graph.replay()
        return logits  # [B, V]; overwritten by the next replay

    def chunk(self, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        if T not in self.verify:
            buf = torch.zeros_like(tokens)
            try:
                graph, out = self._capture(f"verify{T}", lambda: self.eng.model(buf, self.eng.cache, "chunk"))
                self.verify[T] = (graph, buf, out)
            except RuntimeError as e:
                self.verify[T] = None
                self.eng.graph_status += f"; verify pass T={T} runs eager (capture failed: {first_line(e)})"
        if self.verify[T] is None:
            return self.eng.model(tokens, self.eng.cache, "chunk")
        graph, buf, out = self.verify[T]
        buf.copy_(tokens)
        graph.replay()
        return out  # [B, T, V]


def first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def enable(eng):
    """Capture the decode step; on CPU, or if capture fails, the engine runs eager and says why."""
    if eng.device.type != "cuda":
        eng.graph = None
        eng.graph_status = f"off: CUDA graphs need a CUDA device (running on {eng.device.type})"
        return eng
    eng.graph = None
    try:
        with torch.inference_mode():
            graphs = DecodeGraphs(eng)
    except RuntimeError as e:  # capture errors (unsupported op, allocator, illegal sync) surface as RuntimeError
        eng.graph_status = f"off: capture failed ({first_line(e)}); running eager"
        torch.cuda.synchronize()
        return eng
    eng.graph = graphs
    eng.graph_status = f"on: decode step captured in {graphs.capture_ms['decode']:.0f} ms"
    return eng


def disable(eng):
    eng.graph = None
    eng.graph_status = "off: switched off"
    return eng
