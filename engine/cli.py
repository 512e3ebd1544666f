"""decodescope-generate: generate text from the command line, streaming it, then print the run's stats.

    decodescope-generate -p "The capital of France is" -n 32
    decodescope-generate --chat -p "Repeat this list: ..." --ngram -k 8
    decodescope-generate --chat -p "..." --self-draft q4          # the model in q4 drafts for itself
    decodescope-generate --chat -p "..." --layer-skip             # layers to skip calibrated on the prompt
    decodescope-generate big.gguf --draft small.gguf -p "..."     # GGUF files are converted once, then cached
    decodescope-generate MODEL_DIR --device cuda --graphs -p "..."
    decodescope-generate --endpoint http://127.0.0.1:8080/v1 --api-key-env MY_KEY -p "..."   # a serving engine

(`python scripts/generate.py ...` runs the same from a source checkout.)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import unicodedata

from engine import Engine, Tokenizer, load_model
from engine.endpoint import AUTO, SERVER_CHOICES
from engine.weights import FORMATS, QUANTIZED
from engine.tiny import write_tiny_model


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="decodescope-generate", description=__doc__.splitlines()[0].split(": ", 1)[1])
    p.add_argument("model", nargs="?",
                   help="model folder, hub id, GGUF file, or an embedded model: smollm2-135m (the default), "
                        "gemma3-270m")
    p.add_argument("-p", "--prompt", required=True)
    p.add_argument("-n", "--max-new-tokens", type=int, default=64)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--weights", choices=FORMATS, default=None,
                   help="the projections' format (default: q4 where the model ships q4 blocks and the kernels run, "
                        "else the dtype's)")
    p.add_argument("--window", type=int, default=None,
                   help="attend decode steps to the last WINDOW positions and --sinks first ones (default: full)")
    p.add_argument("--sinks", type=int, default=4, help="attention sinks kept with --window")
    p.add_argument("--graphs", action="store_true", help="capture the decode step as a CUDA graph")
    p.add_argument("--no-fused", action="store_true", help="run the torch twins instead of the fused kernels")
    p.add_argument("--tiny", action="store_true", help="a small random-weight model (smoke tests)")
    spec = p.add_mutually_exclusive_group()
    spec.add_argument("--ngram", action="store_true", help="speculate with n-gram prompt lookup")
    spec.add_argument("--layer-skip", nargs="?", const="auto", metavar="N",
                      help="speculate with the model's own layers: skipping those a calibration on the prompt "
                           "picks (no value, or 'auto'), or running the first N")
    spec.add_argument("--draft", metavar="MODEL", help="speculate with a smaller model of the same vocabulary "
                                                       "(folder, hub id or GGUF file)")
    spec.add_argument("--self-draft", choices=[f for f in FORMATS if f in QUANTIZED],
                      help="speculate with the model itself in a cheaper weight format (a second copy of the weights)")
    p.add_argument("-k", type=int, default=5, help="the most draft tokens a round proposes")
    p.add_argument("--fixed-k", action="store_true",
                   help="draft k tokens every round instead of letting the schedule pick (0..k) per round")
    p.add_argument("--ngram-max", type=int, default=3)
    ep = p.add_argument_group("endpoint", "profile a serving engine through its OpenAI-compatible API instead")
    ep.add_argument("--endpoint", metavar="URL", help="the API's base URL, e.g. http://127.0.0.1:8080/v1")
    ep.add_argument("--api-key-env", metavar="VAR", help="the environment variable that holds the API key")
    ep.add_argument("--endpoint-model", default="", help="the served model's name (default: the first it lists)")
    ep.add_argument("--server", choices=SERVER_CHOICES, default=AUTO,
                    help="which server it is, for its own fields (default: probed)")
    ep.add_argument("--stall", type=float, default=30.0, help="seconds of silence mid-stream that end a run")
    return p.parse_args(argv)


def make_drafter(args, eng):
    from engine import speculative

    if args.ngram:
        return speculative.NgramDrafter(max_n=args.ngram_max)
    if args.layer_skip == "auto":
        return speculative.LayerSkipDrafter(eng)
    if args.layer_skip:
        try:
            n_layers = int(args.layer_skip)
        except ValueError:
            raise ValueError(f"--layer-skip {args.layer_skip!r}: give a number of layers, or nothing for a "
                             "calibrated set") from None
        return speculative.LayerSkipDrafter(eng, n_layers=n_layers)
    if args.self_draft:
        drafter = speculative.self_drafter(eng, args.self_draft)
    elif args.draft:
        draft = load_model(args.draft, device=args.device, dtype=args.dtype, fused=not args.no_fused,
                           progress=lambda msg: print(msg, file=sys.stderr))
        drafter = speculative.ModelDrafter(Engine(draft, max_seq_len=args.max_seq_len))
    else:
        return None
    if args.graphs:
        drafter.engine.use_graphs(True)
    return drafter


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


def run_endpoint(args) -> int:
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
        ep = Endpoint(args.endpoint, model=args.endpoint_model, server=args.server, api_key=key, stall_s=args.stall)
        tok = Tokenizer(args.model) if args.model else None  # re-tokenizes only where the server gives no count
        run = stream(ep, args.prompt, chat=args.chat, max_new_tokens=args.max_new_tokens,
                     temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed, tokenizer=tok)
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
    settings = dict(mode="endpoint", max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                    top_p=args.top_p, top_k=args.top_k, seed=args.seed, chat=args.chat)
    stats = endpoint_stats(rounds, run.info, settings)
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
    if args.endpoint:
        return run_endpoint(args)
    name = write_tiny_model(tempfile.mkdtemp(prefix="decodescope-tiny-")) if args.tiny else args.model
    try:
        model = load_model(name, device=args.device, dtype=args.dtype, weights=args.weights, fused=not args.no_fused,
                           progress=lambda msg: print(msg, file=sys.stderr))
        tok = Tokenizer(model.path)
        eng = Engine(model, max_seq_len=args.max_seq_len, window=args.window, sinks=args.sinks)
        if args.graphs:
            eng.use_graphs(True)
        print(f"[weights {model.weight_format} | kernels {eng.kernel_status} | graphs {eng.graph_status} | "
              f"attention {eng.attention_mode}]", file=sys.stderr)
        ids = tok.encode_chat(args.prompt) if args.chat else tok.encode(args.prompt)
        drafter = make_drafter(args, eng)
        sample = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                      top_k=args.top_k, seed=args.seed)
        if drafter:
            from engine import speculative

            rounds = speculative.stream(eng, drafter, ids, k=args.k, adaptive=not args.fixed_k, **sample)
        else:
            rounds = eng.stream(ids, **sample)
        text = tok.stream_decoder()
        done = []
        for rnd in rounds:
            done.append(rnd)
            for t in rnd.emitted:
                print(shown(text.push(t.token_id)), end="", flush=True)
        print(shown(text.flush()))
    except ValueError as e:  # bad input: the message names the value and what to do
        print(f"error: {e}", file=sys.stderr)
        return 2
    stats = eng.stats(done, len(ids), sample)
    if stats.drafter_info:
        print("[" + " | ".join(f"{k}: {v}" for k, v in stats.drafter_info.items()) + "]", file=sys.stderr)
    print(format_summary(stats.summary()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
