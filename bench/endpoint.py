"""Our engine against llama.cpp's llama-server on the same GGUF file and prompt, and this client's view of the
server against the server's own clock, in one run.

    LLAMA_SERVER=.../bin/llama-server python -m bench.endpoint            # -> bench/results/endpoint-cpu.*
    LLAMA_SERVER=... python -m bench.endpoint --record tests/data         # record the parser tests' transcripts

Rows: our engine (q4, the fused kernels) decoding greedily; llama-server plain, seen through the client; and
llama-server with its n-gram lookup drafting on a prompt that quotes its input. Goals, each a ratio in this run:
the client's mean ITL per token within 5% of the server's predicted_per_token_ms; the client's own work (its HTTP
reads and its parsing, in CPU time) under 0.2 ms a chunk; the client's acceptance (from its Rounds) equal to
draft_n_accepted / draft_n; our tok/s at least the server's (its own predicted_per_second, no HTTP in it).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from bench.common import Telemetry, markdown_table, provenance, write_results
from engine.endpoint import Endpoint, endpoint_stats, extra_summary, stream
from engine.endpoint.llamacpp import LlamaServer, binary, missing_reason
from engine.endpoint.transcript import Recorder, save

DATA = Path(__file__).parent / "data"
NGRAM = ["--spec-type", "ngram-simple", "--spec-draft-n-max", "8"]
QUOTE = ("Repeat the following text exactly: The old lighthouse stood at the edge of the cliff. Every night its "
         "lamp turned slowly, sweeping the dark water with a long beam of light.")
ROUNDS = 3  # alternating ours / the server's, each keeping its best


def prose_prompt(words: int = 90) -> str:
    return " ".join((DATA / "prose.txt").read_text().split()[:words])


def client_run(srv: LlamaServer, prompt: str, n: int, chat: bool, tap=None) -> dict:
    s = stream(Endpoint(srv.url, server="llama-server"), prompt, chat=chat, max_new_tokens=n, tap=tap,
               extra={} if chat else {"ignore_eos": True})
    rounds = list(s)
    stats = endpoint_stats(rounds, s.info, dict(max_new_tokens=n))
    summ, x, info = stats.summary(), extra_summary(stats, s.info), s.info
    return dict(engine="llama-server", tokens=summ["tokens"], ttft_ms=summ["ttft_ms"],
                client_itl_ms=summ["itl_mean_ms"], client_tok_s=summ["decode_tok_s"],
                server_ms_per_token=info.server_ms_per_token,
                server_tok_s=1e3 / info.server_ms_per_token if info.server_ms_per_token else None,
                itl_over_server=summ["itl_mean_ms"] / info.server_ms_per_token if info.server_ms_per_token else None,
                parse_ms_per_chunk=info.client_ms_per_chunk, parse_cpu_ms_per_chunk=info.client_cpu_ms_per_chunk,
                read_cpu_ms_per_chunk=info.read_cpu_ms_per_chunk,
                client_cpu_ms_per_chunk=info.client_total_cpu_ms_per_chunk,
                chunks=info.chunks,
                tokens_per_chunk=x["tokens_per_chunk"], acceptance=summ["acceptance_rate"],
                server_acceptance=info.server_acceptance, server_drafted=info.server_drafted,
                server_accepted=info.server_accepted, prompt_tokens=info.prompt_tokens, version=info.server_version)


def ours_run(eng, ids: list[int], n: int) -> dict:
    import torch

    with torch.inference_mode():
        rounds = list(eng.stream(ids, n, stop_ids=[]))
    s = eng.stats(rounds, len(ids)).summary()
    return dict(engine="decodescope", tokens=s["tokens"], ttft_ms=s["ttft_ms"], client_itl_ms=s["itl_mean_ms"],
                client_tok_s=s["decode_tok_s"], server_tok_s=s["decode_tok_s"], prompt_tokens=len(ids))


def better(a: dict | None, b: dict, key: str = "server_tok_s") -> dict:
    return b if a is None or (b.get(key) or 0) > (a.get(key) or 0) else a


def bench(args) -> dict:
    from engine import Engine, Tokenizer, load_model
    from engine.checkpoint.default_model import gguf_path

    gguf = gguf_path()
    model = load_model(None, weights="q4")
    eng, tok = Engine(model, max_seq_len=1024), Tokenizer(model.path)
    prompt = prose_prompt()
    ids = tok.encode(prompt)
    ours_run(eng, ids, 8)  # warm-up
    rows = {}
    with Telemetry("cpu") as tel:
        with LlamaServer(gguf, threads=args.threads) as srv:
            client_run(srv, prompt, 8, chat=False)  # warm-up
            for _ in range(ROUNDS):
                rows["ours"] = better(rows.get("ours"), ours_run(eng, ids, args.new_tokens))
                rows["plain"] = better(rows.get("plain"), client_run(srv, prompt, args.new_tokens, chat=False))
        with LlamaServer(gguf, threads=args.threads, spec=NGRAM) as srv:
            rows["ngram"] = client_run(srv, QUOTE, args.new_tokens, chat=True)
    rows["ours"].update(path=f"q4 {model.ops.name}", weights=model.weight_format)
    rows["plain"].update(path="plain", weights="Q4_1 (the same GGUF)")
    rows["ngram"].update(path="n-gram lookup (ngram-simple, up to 8 drafts)", weights="Q4_1 (the same GGUF)")
    plain, ngram = rows["plain"], rows["ngram"]
    goals = dict(
        client_itl_within_5pct=abs(plain["itl_over_server"] - 1) <= 0.05,
        # all of the client's work, in CPU time (the reader thread's HTTP reads and the parsing): on a loaded
        # machine the wall clock would also count other processes' turns on the core
        client_overhead_under_0_2ms=max(plain["client_cpu_ms_per_chunk"], ngram["client_cpu_ms_per_chunk"]) < 0.2,
        parsing_under_0_2ms=max(plain["parse_cpu_ms_per_chunk"], ngram["parse_cpu_ms_per_chunk"]) < 0.2,
        acceptance_equals_server=ngram["acceptance"] == ngram["server_acceptance"],
        ours_tok_s_at_least_server=rows["ours"]["server_tok_s"] >= plain["server_tok_s"],
    )
    return dict(rows=list(rows.values()), goals=goals, prompt_words=len(prompt.split()), new_tokens=args.new_tokens,
                threads=args.threads, provenance=provenance("cpu", tel))


def record(out: Path, threads: int) -> None:
    """The parser tests' transcripts: a plain and an n-gram run of the real server, every read as it arrived."""
    from engine.checkpoint.default_model import gguf_path

    for name, spec, prompt in (("llama-server-plain", [], prose_prompt(30)), ("llama-server-ngram", NGRAM, QUOTE)):
        with LlamaServer(gguf_path(), threads=threads, spec=spec) as srv:
            rec = Recorder()
            s = stream(Endpoint(srv.url, server="llama-server"), prompt, chat=True, max_new_tokens=40, tap=rec)
            rounds = list(s)
            info = s.info
            header = dict(server="llama-server", server_version=info.server_version,
                          recorded=time.strftime("%Y-%m-%d"),
                          how="recorded from a real run of llama-server (llama-cpp-python 0.3.36's llama.cpp, built by "
                              "scripts/build_llamacpp.sh) by `python -m bench.endpoint --record`",
                          server_args=[a for a in srv.args[1:] if not a.startswith("/")], model="the embedded "
                          "SmolLM2-135M-Instruct GGUF (Q4_1)", prompt=prompt,
                          expect=dict(tokens=len(endpoint_stats(rounds, info).ids),
                                      completion_tokens=info.completion_tokens, draft_n=info.server_drafted,
                                      draft_n_accepted=info.server_accepted,
                                      predicted_per_token_ms=info.server_ms_per_token))
            print(save(out / f"{name}.jsonl", header, rec.reads), header["expect"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--record", metavar="DIR", help="record the parser tests' transcripts into DIR instead")
    args = p.parse_args(argv)
    if binary() is None:
        print(f"bench.endpoint: {missing_reason()}", file=sys.stderr)
        return 2
    if args.record:
        record(Path(args.record), args.threads)
        return 0
    result = bench(args)
    cols = ["engine", "path", "weights", "tokens", "prompt_tokens", "ttft_ms", "client_tok_s", "server_tok_s",
            "client_itl_ms", "server_ms_per_token", "itl_over_server", "read_cpu_ms_per_chunk",
            "parse_cpu_ms_per_chunk", "client_cpu_ms_per_chunk", "tokens_per_chunk", "acceptance", "server_acceptance"]
    goals = "\n".join(f"- {k}: {'met' if v else 'NOT met'}" for k, v in result["goals"].items())
    head = (f"Our engine against llama-server on the same GGUF (the embedded SmolLM2-135M, Q4_1) and a "
            f"{result['prompt_words']}-word prompt, {result['new_tokens']} greedy tokens, {result['threads']} threads, "
            f"one run; llama-server {result['rows'][1].get('version')}. Goals:\n{goals}\n\n")
    for path in write_results(args.out, "endpoint-cpu", result, head + markdown_table(result["rows"], cols)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
