"""A recorded trace (Chrome Trace Event JSON, as torch.profiler exports it) -> where a step's time went, per
layer and op class. Pure: no torch, no engine; engine/observe/profile.py records the trace and adds bytes moved.

The recorder marks what it ran with scopes: a pass window per decode step ("decodescope/step") or verify
pass ("decodescope/verify"), the model's forward ("decodescope/model"), each Block ("decodescope/layer.<i>"),
sampling ("decodescope/sample") and the OpSet's ops ("decodescope/op:rmsnorm", ...; the compiled kernels
record themselves as "decodescope::<op>"). An op's class is that of its outermost classed scope, else its
own name's (aten's matmul family is matmul, index_put_ the KV write, ...). Layers besides the blocks:
engine (the step outside the forward), model (Python in the forward between blocks), embed (before the first
block), head (after the last), sample.

CPU: every microsecond of a window goes to one (layer, class) cell by self time (an event's duration less
its children's), so a window's cells add up to the window. Self time of the structural scopes (window,
model, layer) is Python between ops: the class "host". The same self times split the window into python
(our scopes), dispatch (ops that hand their work to an inner op, and ops that only make views) and kernel
(ops that do the arithmetic). The CPU kernels name a projection's call after its weight format
("decodescope::linear_q4_k"), so a pass also gets the time per format (`formats`, whole calls). CUDA: the
cells hold device time: a kernel is classed by the CPU scope that launched it (matched by correlation id), or
by its name when a CUDA graph launched it (a replay runs no Python, so its kernels land in the one layer
"graph"). The gaps between kernels in a window are the cell ("idle", "host"): the device waiting for the host.
Ideas from HolisticTraceAnalysis (merged kernel intervals for idle time, kernel classes by name), reduced to one
window per step.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

OP_CLASSES = ("matmul", "attention", "norm", "rope", "activation", "kv_write", "sampling", "other", "host")
LAYER_ORDER = ("engine", "model", "embed", None, "head", "sample", "graph", "idle")  # None: the blocks 0..L-1
PASSES = {"decodescope/step": "decode", "decodescope/verify": "verify"}
SCOPE = "decodescope/"  # our scopes: Python between the ops they hold
MODEL, LAYER, SAMPLE, OP = SCOPE + "model", SCOPE + "layer.", SCOPE + "sample", SCOPE + "op:"
KERNEL = "decodescope::"  # what our compiled kernels record
LINEAR = KERNEL + "linear_"  # a projection's kernel, named after its weight format
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# the OpSet's ops (scopes "decodescope/op:<op>") and our kernels' RECORD_FUNCTION names ("decodescope::<op>");
# linear_<format> -> matmul
KERNEL_CLASSES = {"rmsnorm": "norm", "add_rmsnorm": "norm", "rope": "rope", "silu_mul": "activation",
                  "attention": "attention", "decode_attention": "attention", "kv_write": "kv_write",
                  "logsumexp": "sampling", "greedy": "sampling", "softmax": "sampling", "nucleus": "sampling",
                  "race": "sampling", "exp_noise": "sampling"}
ATEN_CLASSES = {
    "matmul": ("mm", "addmm", "matmul", "linear", "bmm", "baddbmm", "_int_mm", "_weight_int8pack_mm",
               "_weight_int4pack_mm", "embedding_bag"),
    "attention": ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_cudnn_attention", "softmax", "_softmax"),
    "norm": ("rms_norm", "_fused_rms_norm", "layer_norm", "native_layer_norm"),
    "activation": ("silu", "silu_", "gelu", "relu"),
    "kv_write": ("index_put_", "index_put", "_index_put_impl_", "index_copy_"),
    "sampling": ("argmax", "multinomial", "exponential_", "topk", "sort", "cumsum", "logsumexp"),
}
ATEN = {f"aten::{op}": cls for cls, ops in ATEN_CLASSES.items() for op in ops}
# ops that make views or allocate: no arithmetic, their time is dispatch
METADATA = {f"aten::{op}" for op in (
    "view", "as_strided", "reshape", "_reshape_alias", "_unsafe_view", "slice", "select", "unsqueeze", "squeeze",
    "expand", "permute", "transpose", "t", "split", "split_with_sizes", "chunk", "unflatten", "flatten",
    "narrow", "unbind", "alias", "detach", "resolve_conj", "resolve_neg", "empty", "empty_like",
    "empty_strided", "result_type", "lift_fresh", "to")}
# kernel names -> class, first match wins (attention before matmul: cutlass-based fmha kernels say both)
KERNEL_NAMES = [(cls, re.compile(p, re.I)) for cls, p in (
    ("attention", r"attention|flash|fmha|softmax"),
    ("matmul", r"gemm|gemv|cutlass|xmma|cublas|nvjet|splitk|matmul|linear"),
    ("norm", r"rms|norm"),
    ("rope", r"rope|rotary"),
    ("activation", r"silu|gelu|act_and_mul"),
    ("kv_write", r"index_put|scatter"),
    ("sampling", r"argmax|exponential|multinomial|topk|sort|distribution"),
)]


def scope_class(name: str) -> str | None:
    """The class of a scope or host op by name; None for structural scopes and ops of no class."""
    for prefix in (OP, KERNEL):
        if name.startswith(prefix):
            op = name[len(prefix):]
            return "matmul" if op.startswith("linear") else KERNEL_CLASSES.get(op, "other")
    if name == SAMPLE:
        return "sampling"
    return ATEN.get(name)


def kernel_class(name: str) -> str:
    return next((cls for cls, pat in KERNEL_NAMES if pat.search(name)), "other")


@dataclass
class Cell:
    ms: float = 0.0
    calls: float = 0.0


@dataclass
class Window:
    """One decode step or verify pass as the trace recorded it."""
    kind: str
    ts: float
    dur: float
    cells: dict = field(default_factory=dict)  # (layer, class) -> Cell, ms within this window
    split: dict = field(default_factory=dict)  # python / dispatch / kernel ms (CPU); device figures (CUDA)
    device: dict = field(default_factory=dict)  # (layer, class) -> Cell from device events
    formats: dict = field(default_factory=dict)  # weight format -> Cell: its projections' kernels, whole calls
    host_ms: float = 0.0  # CUDA: start of the window to the end of its last kernel or graph launch

    def add(self, cells: dict, key, ms: float, calls: float = 0.0) -> None:
        c = cells.setdefault(key, Cell())
        c.ms += ms
        c.calls += calls


@dataclass
class Frame:
    ev: dict
    end: float
    window: Window
    layer: str
    cls: str | None
    structural: bool
    children_us: float = 0.0
    delegated: bool = False  # a child op that computes did this op's arithmetic
    seen_layer: bool = False  # a model frame: a layer has run, so what follows in it is the head


@dataclass
class PassBreakdown:
    """One pass kind (decode or verify) averaged over its quieter windows, ms per window."""
    kind: str
    windows: int  # profiled
    used: int  # averaged: those at or below the median duration (a step that lost its core says nothing)
    step_ms: float  # profiled wall time of a window
    cells: dict  # (layer, class) -> Cell
    split: dict  # CPU: python_ms, dispatch_ms, kernel_ms; CUDA: host_ms, device_ms, idle_ms
    on_device: bool
    formats: dict = field(default_factory=dict)  # weight format -> Cell (CPU kernels' linear_<format> calls)


def _child_context(parent: Frame, ev: dict) -> tuple[str, str | None, bool]:
    """(layer, class, structural) of an event inside parent."""
    name = ev.get("name", "")
    if parent.cls is not None:  # the outermost classified scope wins
        return parent.layer, parent.cls, False
    if name.startswith(LAYER):
        return name[len(LAYER):], None, True
    if name == MODEL:  # its own self time is Python in the forward between the blocks
        return "model", None, True
    layer = parent.layer
    if parent.ev.get("name") == MODEL:
        layer = "head" if parent.seen_layer else "embed"
    elif name == SAMPLE:
        layer = "sample"
    return layer, scope_class(name), False


def _walk(events: list[dict], kinds: dict) -> tuple[list[Window], dict]:
    """Nest one thread's events; fill each window's cells by self time. Returns the windows and, per
    correlation id of a launch inside a window, (window, layer, class or None, launch name)."""
    windows, launches, stack = [], {}, []

    def close(f: Frame) -> None:
        ev, w = f.ev, f.window
        self_ms = max(0.0, ev["dur"] - f.children_us) / 1e3
        cls = f.cls or ("host" if f.structural else "other")
        parent = stack[-1] if stack else None
        # a call: the outermost event of a class, or an unclassed op right inside a structural scope
        call = (not f.structural and parent is not None and parent.cls is None and ev.get("cat") != "cuda_runtime"
                and (f.cls is not None or parent.structural))
        w.add(w.cells, (f.layer, cls), self_ms, float(call))
        name = ev.get("name", "")
        kind = ("python" if ev.get("cat") == "user_annotation" or name.startswith(SCOPE) else
                "dispatch" if f.delegated or name in METADATA or ev.get("cat") != "cpu_op" else "kernel")
        w.split[kind] = w.split.get(kind, 0.0) + self_ms
        if name.startswith(LINEAR):  # whole calls (they nest nothing of another format)
            w.add(w.formats, name[len(LINEAR):], ev["dur"] / 1e3, 1.0)
        if parent is not None and parent.ev.get("name") == MODEL and ev.get("name", "").startswith(LAYER):
            parent.seen_layer = True

    for ev in events:
        ts, end = ev["ts"], ev["ts"] + ev["dur"]
        while stack and ts >= stack[-1].end - 1e-3:
            close(stack.pop())
        if ev.get("name") in kinds:
            if stack:  # a window inside another window: not something the recorder makes
                continue
            w = Window(kinds[ev["name"]], ts, ev["dur"])
            windows.append(w)
            stack.append(Frame(ev, end, w, "engine", None, True))
            continue
        if not stack:
            continue  # outside every window
        parent = stack[-1]
        parent.children_us += min(end, parent.end) - ts
        # an op that calls another op that computes only dispatched: its own time is not the arithmetic
        name = ev.get("name", "")
        parent.delegated |= ev.get("cat") == "cpu_op" and name not in METADATA and not name.startswith(SCOPE)
        layer, cls, structural = _child_context(parent, ev)
        corr = ev.get("args", {}).get("correlation")
        if ev.get("cat") in ("cuda_runtime", "cuda_driver") and corr is not None:
            launches[corr] = (parent.window, layer, cls, ev.get("name", ""))
            # the host has issued the step once its last launch returns (a copy to pageable memory or a
            # synchronize blocks until the device is done: that is waiting, not issuing)
            if "Launch" in ev.get("name", ""):
                parent.window.host_ms = max(parent.window.host_ms, (end - parent.window.ts) / 1e3)
        stack.append(Frame(ev, min(end, parent.end), parent.window, layer, cls, structural))
    while stack:
        close(stack.pop())
    return windows, launches


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            total += (cur_e - cur_s) if cur_e is not None else 0.0
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + ((cur_e - cur_s) if cur_e is not None else 0.0)


def _device(windows: list[Window], launches: dict, device_events: list[dict]) -> None:
    """Device cells per window: kernels by their launch's scope (or name), and the gaps as idle."""
    spans: dict[int, list] = {}
    for ev in device_events:
        hit = launches.get(ev.get("args", {}).get("correlation"))
        if hit is None:
            continue
        w, layer, cls, launch = hit
        if "GraphLaunch" in launch:
            layer, cls = "graph", None
        w.add(w.device, (layer, cls or kernel_class(ev.get("name", ""))), ev["dur"] / 1e3, 1.0)
        lo, hi = max(ev["ts"], w.ts), min(ev["ts"] + ev["dur"], w.ts + w.dur)
        if hi > lo:
            spans.setdefault(id(w), []).append((lo, hi))
    for w in windows:
        busy_ms = _busy_us(spans.get(id(w), [])) / 1e3
        idle_ms = max(0.0, w.dur / 1e3 - busy_ms)
        w.add(w.device, ("idle", "host"), idle_ms)
        w.split = dict(host_ms=w.host_ms, device_ms=busy_ms, idle_ms=idle_ms)


def quiet(items: list, key=lambda x: x) -> list:
    """The items at or below the median (of key): on a shared machine a step that lost its core to another
    job measures the other job."""
    med = statistics.median(key(x) for x in items)
    return [x for x in items if key(x) <= med]


def row_order(key: tuple[str, str]) -> tuple:
    """(layer, class) in step order: engine, model, embed, blocks 0.., head, sample, graph, idle; classes
    as OP_CLASSES lists them."""
    layer, cls = key
    rank = (LAYER_ORDER.index(None), int(layer)) if layer.isdigit() else (
        LAYER_ORDER.index(layer) if layer in LAYER_ORDER else len(LAYER_ORDER), 0)
    return (*rank, OP_CLASSES.index(cls) if cls in OP_CLASSES else len(OP_CLASSES))


def _average(kind: str, windows: list[Window], on_device: bool) -> PassBreakdown:
    used = quiet(windows, key=lambda w: w.dur)
    n = len(used)
    cells: dict = {}
    split: dict = {}
    formats: dict = {}
    for w in used:
        for key, c in (w.device if on_device else w.cells).items():
            w.add(cells, key, c.ms / n, c.calls / n)
        for fmt, c in w.formats.items():
            w.add(formats, fmt, c.ms / n, c.calls / n)
        for k, v in w.split.items():
            split[k] = split.get(k, 0.0) + v / n
    step_ms = sum(w.dur for w in used) / n / 1e3
    return PassBreakdown(kind, len(windows), n, step_ms, cells, split, on_device, formats)


def reduce_trace(trace: dict) -> dict[str, PassBreakdown]:
    """Trace Event JSON (a dict with traceEvents) -> {"decode": ..., "verify": ...} for the passes it holds."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    marks = [e for e in events if e.get("name") in PASSES]
    if not marks:
        raise ValueError(f"the trace has no pass scopes ({', '.join(PASSES)}); record it with engine.profile")
    thread = (marks[0].get("pid"), marks[0].get("tid"))
    host = sorted((e for e in events if (e.get("pid"), e.get("tid")) == thread and e.get("cat") not in DEVICE_CATS),
                  key=lambda e: (e["ts"], -e["dur"]))
    windows, launches = _walk(host, PASSES)
    device_events = [e for e in events if e.get("cat") in DEVICE_CATS]
    on_device = bool(device_events)
    if on_device:
        _device(windows, launches, device_events)
    out = {}
    for kind in dict.fromkeys(w.kind for w in windows):
        out[kind] = _average(kind, [w for w in windows if w.kind == kind], on_device)
    return out
