"""decodescope (or `python app.py` in a source checkout): the Gradio app. Argument parsing and launch only."""
from __future__ import annotations

import argparse
import atexit

try:  # first of all where it is installed: on ZeroGPU it patches torch, which must happen before any CUDA call
    import spaces  # noqa: F401  (elsewhere it imports neither torch nor gradio, and changes nothing)
except ImportError:
    pass

import engine  # noqa: E402, F401  (next: it sets OpenMP's wait policy before torch loads, where spaces did not)


def parse_args(argv=None) -> argparse.Namespace:
    from engine.checkpoint.load import KV_CACHES
    from engine.weights import FORMATS, QUANTIZED
    from ui.startup import KNOWN_MODELS

    p = argparse.ArgumentParser(prog="decodescope",
                                description="Stream LLM decoding token by token and see where the time goes.")
    p.add_argument("--model", action="append", default=None, metavar="NAME",
                   help="model folder, hub id, GGUF file or embedded model; repeat to offer several in the page's "
                        "picker (the first loads at start, the others on their first pick). Default: the embedded "
                        "SmolLM2-135M, with the embedded Gemma 3 270M (gemma3-270m) offered beside it. One of "
                        f"{', '.join(KNOWN_MODELS)} unless --allow-any-model")
    p.add_argument("--draft", action="append", default=[], metavar="PATH_OR_ID",
                   help="a draft model for 'draft model' mode (the first model's vocabulary; folder, hub id or GGUF "
                        "file); repeat for several")
    p.add_argument("--self-draft", choices=(*[f for f in FORMATS if f in QUANTIZED], "none"), default="q4",
                   help="the weight format of the model's own copy that drafts for it in 'self-draft' mode")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--weights", choices=FORMATS, default=None,
                   help="the weight format at launch (default: a GGUF file's own blocks as llama.cpp runs them, q4_a8 "
                        "for the default model's Q4_1 on a CPU and q4 on CUDA, else the dtype's; q4 keeps the file's "
                        "exact values); the page can switch formats")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                   help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--max-seq-len", type=int, default=2048, help="KV cache positions (prompt + new tokens)")
    p.add_argument("--kv-cache", choices=KV_CACHES, default="auto",
                   help="the KV cache's dtype: auto is fp16 on the CPU kernels (half the bytes a cached position adds "
                        "to a step), the activations' dtype elsewhere")
    p.add_argument("--host", default=None, help="default 127.0.0.1 (GRADIO_SERVER_NAME overrides)")
    p.add_argument("--port", type=int, default=None, help="default 7860 (GRADIO_SERVER_PORT overrides)")
    p.add_argument("--share", action="store_true", help="open a public gradio.live link")
    p.add_argument("--allow-any-model", action="store_true",
                   help="accept any folder or hub id for --model / --draft, not only the launch list")
    p.add_argument("--tiny", action="store_true", help="tiny random-weight models (tests, smoke runs)")
    p.add_argument("--no-example-check", action="store_true",
                   help="offer every example without first timing it against plain decoding on this machine (the "
                        "check runs once per machine and model, its verdicts kept in the model cache)")
    p.add_argument("--endpoint", action="append", default=[], metavar="URL",
                   help="a serving engine's OpenAI-compatible API the page may profile "
                        "(e.g. http://127.0.0.1:8080/v1); "
                        "repeat for several")
    p.add_argument("--allow-any-endpoint", action="store_true",
                   help="let the page take any endpoint URL a visitor types (off: a public app must not fetch any "
                        "address it is given)")
    p.add_argument("--api-key-env", metavar="VAR", help="the environment variable holding the endpoints' API key")
    p.add_argument("--endpoint-stall", type=float, default=30.0, metavar="S",
                   help="seconds of silence mid-stream that end an endpoint run (its tokens so far kept)")
    return p.parse_args(argv)


def endpoint_options(args) -> dict:
    """The Runtime's endpoint fields, checked at launch: each URL, and the key variable when one is named."""
    import os

    from engine.endpoint import check_url

    try:
        urls = list(dict.fromkeys(check_url(u) for u in args.endpoint))
    except ValueError as e:
        raise SystemExit(f"--endpoint: {e}") from None
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env) or None
        if key is None:
            raise SystemExit(f"--api-key-env {args.api_key_env}: that variable is not set or empty")
    return dict(endpoints=urls, allow_any_endpoint=args.allow_any_endpoint, endpoint_key=key,
                endpoint_stall_s=args.endpoint_stall)


def main(argv=None) -> None:
    args = parse_args(argv)
    from ui import layout

    models = build_models(args)
    atexit.register(models.close)
    demo = layout.build(models)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, **layout.launch_kwargs())


def build_models(args):
    """The page's models: the first built now, the others (same options, no draft models: those share the first
    one's vocabulary) on their first pick. --tiny is one tiny model."""
    from functools import partial

    from ui.models import Runtimes
    from ui.startup import OFFERED, build_runtime, check_allowed, first_load, title, zero_gpu

    names = list(dict.fromkeys(args.model or OFFERED))
    if not args.tiny:
        check_allowed([*names, *args.draft], args.allow_any_model)
    options = endpoint_options(args)
    common = dict(device=args.device, dtype=args.dtype, max_seq_len=args.max_seq_len, weights=args.weights,
                  self_draft=None if args.self_draft == "none" else args.self_draft, kv_cache=args.kv_cache)
    check = not (args.tiny or args.no_example_check or zero_gpu())  # ZeroGPU: no GPU here to time them on
    first = checked(build_runtime, check, names[0], args.draft, tiny=args.tiny, **common)
    for name, value in options.items():
        setattr(first, name, value)
    timed = ", then times its examples against plain decoding on this machine (once)" if check else ""
    later = {} if args.tiny else {title(n): (first_load(n) + timed, partial(checked, build_runtime, check, n, **common))
                                  for n in names[1:]}
    return Runtimes(first, later)


def checked(build, check: bool, *args, **kwargs):
    """build(*args, **kwargs), then its examples timed against plain decoding here (ui/example_check.py)."""
    from ui import example_check

    rt = build(*args, **kwargs)
    if check:
        example_check.check(rt)
    return rt


if __name__ == "__main__":
    main()
