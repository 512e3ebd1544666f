"""The scopes a profiled pass is recorded under: the model's forward, each Block, the OpSet's ops and the cache's KV
write, each named as engine/observe/breakdown.py classes it (and as the CPU kernels name their own), installed for
one profiled pass and removed after it (engine/observe/profile.py)."""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager

from torch._C._profiler import _RecordFunctionFast as Scope

from engine.observe.breakdown import LAYER, MODEL, OP

OPSET_SCOPES = {"rmsnorm": "rmsnorm", "add_rmsnorm": "add_rmsnorm", "rope_": "rope", "silu_mul": "silu_mul",
                "attention": "attention"}  # OpSet field -> the op's name, as the CPU kernels record it


def scoped(name: str, fn, *args, **kwargs):
    with Scope(name):
        return fn(*args, **kwargs)


def scoped_ops(ops):
    """The OpSet with each op inside a scope named as the CPU kernels name theirs, so the torch twins and
    the kernels are classed alike."""
    def wrap(name, fn):
        def op(*args, **kwargs):
            return scoped(OP + name, fn, *args, **kwargs)
        return op

    return dataclasses.replace(ops, **{f: wrap(n, getattr(ops, f)) for f, n in OPSET_SCOPES.items()})


@contextmanager
def scopes(model, cache=None):
    """Scopes on the forward and each Block (forward hooks), on the OpSet's ops and on the cache's KV write
    (an index_put, or a slice copy where the host knows the positions); a projection is classed by its op's
    name (aten's matmul family, or the kernels' decodescope::linear_<format>).

    With the CPU kernels the blocks run in one native call that records the same layer scopes and the
    KV write itself (csrc/cpu/ops_blocks.cpp), so the blocks are not hooked: a hook would force the Python
    loop and profile a path the engine does not run.

    Each hooked module call costs microseconds of Python, as much as a small projection's kernel, so the 4
    projections of every Block are left unhooked. model.ops is swapped without use_ops: the version a captured
    graph checks stays put (a replay runs no Python, so graphs see no scopes either way)."""
    open_scopes, handles = [], []

    def hook(module, name):
        def pre(*_):
            scope = Scope(name)
            scope.__enter__()
            open_scopes.append(scope)

        def post(*_):
            open_scopes.pop().__exit__(None, None, None)

        handles.extend((module.register_forward_pre_hook(pre), module.register_forward_hook(post)))

    hook(model, MODEL)
    if model.ops.blocks is None:  # the native block loop (CPU kernels) records its own layer scopes
        for i, block in enumerate(model.layers):
            hook(block, f"{LAYER}{i}")
    saved = model.ops
    model.ops = scoped_ops(saved)
    if cache is not None:  # an instance attribute shadows the method while profiling; del restores it
        write = cache.write
        cache.write = lambda *args, **kwargs: scoped(OP + "kv_write", write, *args, **kwargs)
    try:
        yield
    finally:
        model.ops = saved
        if cache is not None:
            del cache.write
        for h in handles:
            h.remove()
        while open_scopes:
            open_scopes.pop().__exit__(None, None, None)
