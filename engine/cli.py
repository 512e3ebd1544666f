"""decodescope-generate: generate text from the command line, streaming it, then print the run's stats.

    decodescope-generate -p "The capital of France is" -n 32 --no-chat
    decodescope-generate -p "Repeat this list: ..." --mode n-gram -k 8
    decodescope-generate -p "..." --mode self-draft                    # a cheaper copy, or layers skipped: measured
    decodescope-generate -p "..." --mode self-draft --self-draft q4    # the model in q4 drafts for itself
    decodescope-generate -p "..." --mode layer-skip                    # layers to skip calibrated on the prompt
    decodescope-generate big.gguf --mode "draft model" --draft-model small.gguf -p "..."
    decodescope-generate MODEL_DIR --device cuda -p "..."              # CUDA graphs and fused kernels by default
    decodescope-generate --backend endpoint --endpoint http://127.0.0.1:8080/v1 --api-key-env MY_KEY -p "..."

The run's settings are the page's, under the same names (engine/request.py declares them once); the other
flags say what to load. (`python scripts/generate.py ...` runs the same from a source checkout.)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import unicodedata

from engine import Engine, Tokenizer, load_model, request, speculative
from engine.checkpoint.load import KV_CACHES
from engine.weights import FORMATS, QUANTIZED
from engine.tiny import write_tiny_model


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="decodescope-generate", description=__doc__.splitlines()[0].split(": ", 1)[1])
    p.add_argument("model", nargs="?",
                   help="model folder, hub id, GGUF file, or an embedded model: smollm2-135m (the default), "
                        "gemma3-270m")
    p.add_argument("-p", "--prompt", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--kv-cache", choices=KV_CACHES, default="auto",
                   help="the KV cache's dtype: auto is fp16 on the CPU kernels, the activations' dtype elsewhere")
    p.add_argument("--sinks", type=int, default=request.SINKS, help="attention sinks kept with --window")
    p.add_argument("--tiny", action="store_true", help="a small random-weight model (smoke tests)")
    p.add_argument("--self-draft", choices=["auto", *[f for f in FORMATS if f in QUANTIZED]], default="auto",
                   help="self-draft mode: the weight format of the model's own copy that drafts (a second copy "
                        "of the weights); auto: such a copy where its measured step is much cheaper than the "
                        "model's, else the model's own weights with layers skipped (a K-quant file's case)")
    p.add_argument("--api-key-env", metavar="VAR", help="endpoint backend: the environment variable that holds "
                                                         "the API key")
    p.add_argument("--endpoint-stall", type=float, default=30.0, metavar="S",
                   help="endpoint backend: seconds of silence mid-stream that end a run")
    request.add_flags(p, skip=("model",))
    return p.parse_args(argv)


def make_drafter(args, req: request.Request, eng):
    """The run's drafter: in 'self-draft' mode the model's own weights made cheaper (--self-draft), in 'draft
    model' mode --draft-model loaded; a drafting engine of its own replays graphs where the request asks for
    them (a layer-skip view follows the target's)."""
    if req.mode == "self-draft":
        drafter = speculative.self_drafter(eng, None if args.self_draft == "auto" else args.self_draft)
        if drafter.chosen:
            print(f"[self-draft: {drafter.chosen}]", file=sys.stderr)
        draft = None if isinstance(drafter, speculative.LayerSkipDrafter) else drafter.engine
    elif req.mode == "draft model":
        draft = Engine(load_draft(args, req), max_seq_len=args.max_seq_len)
        drafter = request.make_drafter(req, eng, draft)
    else:
        return request.make_drafter(req, eng)
    if req.cuda_graphs and draft is not None:
        draft.use_graphs(True)
    return drafter


def load_draft(args, req: request.Request):
    if not req.draft_model:
        raise ValueError("draft model mode needs --draft-model (a folder, hub id or GGUF file of the same "
                         "vocabulary)")
    return load_model(req.draft_model, device=args.device, dtype=args.dtype, fused=req.fused_kernels,
                      progress=lambda msg: print(msg, file=sys.stderr), kv_cache=args.kv_cache)


def format_summary(s: dict) -> str:
    """The run's stats line (Stats.summary's figures under the names the page uses)."""
    line = (f"{s['tokens']} tokens | TTFT {s['ttft_ms']:.1f} ms | ITL p50 {s['itl_p50_ms']:.1f} ms "
            f"p99 {s['itl_p99_ms']:.1f} ms | {s['decode_tok_s']:.1f} tok/s")
    if s["peak_memory_mb"] == s["peak_memory_mb"]:  # an endpoint's memory is the server's, not measured here
        line += f" | peak {s['peak_memory_mb']:.0f} MB"
    spec_run = s.get("mean_k") == s.get("mean_k")
    acc, mal, draft = s["acceptance_rate"], s["mean_accepted_len"], s["draft_overhead_pct"]
    if spec_run or acc == acc:  # our speculative run, or an endpoint whose server drafted
        line += (f"\nacceptance {'- (nothing drafted)' if acc != acc else f'{100 * acc:.1f}%'} | mean accepted "
                 f"length {'-' if mal != mal else f'{mal:.2f}'} (tokens per verify pass: accepted drafts + 1)")
        if draft == draft:  # the drafter's time is ours to measure only where the drafter is ours
            line += f" | drafting {draft:.1f}% of decode time"
    if spec_run:
        line += f"\nmean k {s['mean_k']:.2f} | plain steps {s['plain_round_pct']:.0f}% of rounds"
    return line


def run_endpoint(args, req: request.Request) -> int:
    """The same stream and stats line, from a serving engine's endpoint; the key only from the environment."""
    import os

    from engine.endpoint import Endpoint, EndpointError, endpoint_stats, extra_summary, format_extra, stream

    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            print(f"error: --api-key-env {args.api_key_env}: that variable is not set or empty", file=sys.stderr)
            return 2
    try:
        ep = Endpoint(req.endpoint, model=req.endpoint_model, server=req.server, api_key=key,
                      stall_s=args.endpoint_stall)
        tok = Tokenizer(args.model) if args.model else None  # re-tokenizes only where the server gives no count
        s = req.sampling
        run = stream(ep, args.prompt, chat=req.chat, max_new_tokens=req.max_new_tokens, temperature=s.temperature,
                     top_p=s.top_p, top_k=s.top_k, seed=s.seed, tokenizer=tok)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rounds, failed = [], None
    try:
        for rnd in run:
            rounds.append(rnd)
            print(shown("".join(t.text or "" for t in rnd.emitted)), end="", flush=True)
    except EndpointError as e:
        failed = e
    except KeyboardInterrupt:
        failed = "stopped"
    print()
    stats = endpoint_stats(rounds, run.info, req.flat())
    if rounds:
        print(format_summary(stats.summary()), file=sys.stderr)
        print(shown(format_extra(extra_summary(stats, run.info))), file=sys.stderr)
    if failed is not None:
        print(shown(f"error: {failed}"), file=sys.stderr)
        return 1
    return 0


BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def shown(text: str) -> str:
    """text safe to print on a terminal: control characters (ESC, BEL, CR, backspace...) and bidi overrides shown
    as escapes, not executed; newlines and tabs kept. A model's or a server's text could otherwise retitle the
    window, recolour the terminal or overwrite what was printed."""
    return "".join(c if c in "\n\t" or not (unicodedata.category(c) == "Cc" or c in BIDI)
                   else c.encode("unicode_escape").decode("ascii") for c in text)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        req = request.from_flags(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if req.on_endpoint:
        return run_endpoint(args, req)
    name = write_tiny_model(tempfile.mkdtemp(prefix="decodescope-tiny-")) if args.tiny else args.model
    try:
        model = load_model(name, device=args.device, dtype=args.dtype, weights=req.weights or None,
                           fused=req.fused_kernels, progress=lambda msg: print(msg, file=sys.stderr),
                           kv_cache=args.kv_cache)
        tok = Tokenizer(model.path)
        eng = Engine(model, max_seq_len=args.max_seq_len, window=req.window or None, sinks=args.sinks)
        request.configure(eng, req, args.sinks)
        chat = req.chat and tok.chat_template is not None
        kv = str(eng.cache.k.dtype).removeprefix("torch.")
        print(f"[weights {model.weight_format} | kernels {eng.kernel_status} | graphs {eng.graph_status} | "
              f"attention {eng.attention_mode} | KV cache {kv}" + ("" if chat == req.chat else " | no chat template: "
                                                                   "the prompt goes as it is") + "]", file=sys.stderr)
        ids = tok.encode_chat(args.prompt) if chat else tok.encode(args.prompt)
        drafter = make_drafter(args, req, eng)
        text = tok.stream_decoder()
        done = []
        for rnd in request.stream(eng, req, ids, drafter):
            done.append(rnd)
            for t in rnd.emitted:
                print(shown(text.push(t.token_id)), end="", flush=True)
        print(shown(text.flush()))
    except ValueError as e:  # bad input: the message names the value and what to do
        print(f"error: {e}", file=sys.stderr)
        return 2
    stats = eng.stats(done, len(ids), req.flat())
    if stats.drafter_info:
        print("[" + " | ".join(f"{k}: {v}" for k, v in stats.drafter_info.items()) + "]", file=sys.stderr)
    print(format_summary(stats.summary()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
