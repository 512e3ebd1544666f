"""CUDA graph capture of the whole decode step and of the fixed-size verify pass.

A decode step at batch 1 is hundreds of small kernels; launching them from Python costs more than
running them. A captured graph replays them with one launch. Shapes never depend on position (positions
come from cache.seq_lens on the device, attention reads by seq_lens, the fused decode kernel plans its
splits on the device), so one capture serves every length. A step is then the cache's length advance,
a copy into the static token buffer and a replay; the only host sync stays the read of the sampled id.

A graph reads its inputs by address: the model's weights, rope tables and kernel workspaces. Whatever
replaces one of those (a larger Engine growing the rope table, switching kernels) bumps model.version, and
a graph captured under another version is captured again before its next replay. The graph also holds
references to what it read, so nothing it points at is freed while it exists.
"""
from __future__ import annotations

import time

import torch

WARMUP_ITERS = 3


class DecodeGraphs:
    """One graph per token count T: T = 1 (the decode step) at once, verify lengths on first use."""

    def __init__(self, eng):
        self.eng = eng
        self.pool = torch.cuda.graph_pool_handle()
        self.capture_ms: dict[str, float] = {}
        self.graphs: dict[int, tuple | None] = {}  # T -> (graph, token buffer, logits) or None (runs eager)
        self._capture(1)

    def _capture(self, T: int) -> None:
        """Warm up (cuBLAS handles and workspaces, the kernels' workspaces, allocator pools), then capture the
        forward of T tokens.

        Warm-up really runs the forward, on a side stream, so it writes K/V: into a scratch cache of T positions
        (KVCache.scratch), never past this cache's end, which a capture mid-run (a new verify size, a recapture
        after a toggle) may be right at. The capture runs nothing: it records the forward on this cache, whose
        replays write the positions the cache's length says, as an eager step would."""
        eng, model = self.eng, self.eng.model
        t0 = time.perf_counter()
        buf = torch.zeros(eng.cache.batch_size, T, dtype=torch.long, device=eng.device)

        def forward(cache):
            return model(buf, cache, "cached", window=eng.window or 0, sinks=eng.sinks)

        scratch = eng.cache.scratch(T)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_ITERS):
                forward(scratch)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = forward(eng.cache)
        torch.cuda.synchronize()
        # held, so nothing the graph reads by address is freed while it exists
        self.pinned = (model.version, model.ops, model.cos, model.sin)
        self.graphs[T] = (graph, buf, out)
        self.capture_ms["decode" if T == 1 else f"verify{T}"] = (time.perf_counter() - t0) * 1e3

    def stale(self) -> bool:
        return self.pinned[0] != self.eng.model.version

    def run(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T, V] (a buffer the next replay overwrites). The cache's length
        already counts the T tokens."""
        T = tokens.shape[1]
        if self.stale():
            self.graphs.clear()
            self._capture(1)
        if T not in self.graphs:
            try:
                self._capture(T)
            except RuntimeError as e:
                self.graphs[T] = None
                self.eng.graph_status += f"; verify pass T={T} runs eager (capture failed: {first_line(e)})"
        if self.graphs[T] is None:
            eng = self.eng
            return eng.model(tokens, eng.cache, "cached", window=eng.window or 0, sinks=eng.sinks)
        graph, buf, out = self.graphs[T]
        buf.copy_(tokens)
        graph.replay()
        return out


def first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def capture(eng) -> tuple[DecodeGraphs | None, str]:
    """(graphs, status) for eng: None and the reason on CPU, or when capture fails."""
    if eng.device.type != "cuda":
        return None, f"off: CUDA graphs need a CUDA device (running on {eng.device.type})"
    try:
        with torch.inference_mode():
            graphs = DecodeGraphs(eng)
    except RuntimeError as e:  # capture errors (unsupported op, allocator, illegal sync) surface as RuntimeError
        torch.cuda.synchronize()
        return None, f"off: capture failed ({first_line(e)}); running eager"
    return graphs, f"on: decode step captured in {graphs.capture_ms['decode']:.0f} ms"
