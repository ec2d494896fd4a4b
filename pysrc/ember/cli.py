"""The `ember` command: `run` a completion or a chat, `info` about a model file,
`bench` its speed as llama-bench measures it, `serve` a model over HTTP (its
flags live in `ember.server.cli`), and `pull`, `list` and `rm` the models
fetched by name (`ember.hub`)."""

from __future__ import annotations

import argparse
import os
import sys

from ember.errors import EmberError, ModelFetchError

__all__ = ["main"]


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", help="GGUF model file (default: SmolLM2-135M-Instruct, fetched once)")
    p.add_argument("-c", "--ctx-size", type=int, default=0, help="context length (0: the model's trained length)")
    p.add_argument("-t", "--threads", type=int, default=0, help="worker threads (0: physical cores)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--n-predict", type=int, default=256, help="tokens to generate at most")
    p.add_argument("--temp", type=float, default=0.8, help="temperature (0: greedy)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--repeat-last-n", type=int, default=64)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("-s", "--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("-r", "--reverse-prompt", action="append", default=[], help="stop string (repeatable)")


def _sampling(a: argparse.Namespace) -> dict:
    return dict(
        temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p, repeat_penalty=a.repeat_penalty,
        repeat_last_n=a.repeat_last_n, presence_penalty=a.presence_penalty, frequency_penalty=a.frequency_penalty,
        seed=a.seed, ignore_eos=a.ignore_eos, stop=a.reverse_prompt,
    )


def _load(a: argparse.Namespace):
    from ember.model import Model

    return Model(a.model, n_ctx=a.ctx_size, threads=a.threads)


def cmd_run(a: argparse.Namespace) -> int:
    model = _load(a)
    if a.chat:
        return _chat_loop(model, a)
    prompt = a.prompt
    if prompt is None:
        prompt = sys.stdin.read()
    sys.stdout.write(prompt)
    sys.stdout.flush()
    for piece in model.generate(prompt, a.n_predict, stream=True, **_sampling(a)):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def _chat_loop(model, a: argparse.Namespace) -> int:
    messages: list[dict] = []
    if a.system:
        messages.append({"role": "system", "content": a.system})
    print(f"ember: chatting with {model.name}; an empty line or Ctrl-D ends.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return 0
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line})
        reply = []
        try:
            for delta in model.chat(messages, a.n_predict, stream=True, **_sampling(a)):
                # The thought is shown as it comes; only the answer joins the conversation.
                piece = delta.get("reasoning_content") or delta.get("content") or ""
                if delta.get("content"):
                    reply.append(delta["content"])
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            sys.stdout.write(" [interrupted]")
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_info(a: argparse.Namespace) -> int:
    from ember import _native

    path = a.model
    if path is None:
        from ember.fetch import default_model_path

        path = str(default_model_path())
    info = _native.inspect(path)
    meta = info["metadata"]
    arch = meta.get("general.architecture", "?")
    print(f"file:           {path} ({_human_bytes(info['file_size'])}, GGUF v{info['version']})")
    print(f"architecture:   {arch}")
    print(f"name:           {meta.get('general.name', '')}")
    for label, key in [
        ("context", "context_length"),
        ("embedding", "embedding_length"),
        ("layers", "block_count"),
        ("heads", "attention.head_count"),
        ("kv heads", "attention.head_count_kv"),
        ("feed-forward", "feed_forward_length"),
        ("rope base", "rope.freq_base"),
        ("sliding window", "attention.sliding_window"),
    ]:
        v = meta.get(f"{arch}.{key}")
        if v is not None:
            print(f"{label + ':':<16}{v}")
    n_tokens = str(meta.get("tokenizer.ggml.tokens", "?")).strip("[]").replace(" values", "")
    print(f"tokenizer:      {meta.get('tokenizer.ggml.model', '?')} (pre: {meta.get('tokenizer.ggml.pre', '-')}, {n_tokens} tokens)")
    print(f"chat template:  {'yes' if 'tokenizer.chat_template' in meta else 'none (ember uses a built-in fallback)'}")
    by_type: dict[str, list[int]] = {}
    for _, ty, _, nbytes in info["tensors"]:
        c = by_type.setdefault(ty, [0, 0])
        c[0] += 1
        c[1] += nbytes
    print(f"tensors:        {len(info['tensors'])}")
    for ty, (count, nbytes) in sorted(by_type.items(), key=lambda kv: -kv[1][1]):
        print(f"  {ty:<8} {count:>5} tensors  {_human_bytes(nbytes):>10}")
    try:
        model = _native.Model(path, 0, 1)
    except EmberError as e:
        print(f"ember cannot run this file: {e}")
        return 1
    # A file with a tensor the forward pass leaves unread does not load (the
    # error above names them), so a loaded model reads every one.
    c = model.config()
    print(f"weights:        every tensor is read by the {arch} forward pass")
    if c["n_expert"]:
        print(f"experts:        {c['n_expert_used']} of {c['n_expert']} per token")
    n_shared = c["n_layer"] - c["n_layer_kv"] - c["n_layer_recurrent"]
    if n_shared:
        print(f"kv layers:      {c['n_layer_kv']} of {c['n_layer']} (the others read an earlier layer's cache)")
    if c["n_layer_recurrent"]:
        print(f"recurrent:      {c['n_layer_recurrent']} of {c['n_layer']} layers keep a state instead of keys and values, "
              f"{_human_bytes(c['recurrent_state_bytes'])} per sequence")
    print(f"kv cache:       {_human_bytes(c['kv_bytes_per_position'])} per position (f16)")
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    from ember.bench import BenchError, check_args, main_bench, parse_depths

    try:
        check_args(a.n_prompt, a.n_gen, a.repetitions, a.threads, a.batch_size)
        depths = parse_depths(a.n_depth)
        path = a.model
        if path is None:
            from ember.fetch import default_model_path

            path = default_model_path()
        return main_bench(path, a.n_prompt, a.n_gen, a.repetitions, a.threads, a.batch_size, a.json, depths=depths,
                          kv_type=a.cache_type, gpu_layers=a.n_gpu_layers, device=a.device)
    except BenchError as e:
        print(f"ember bench: error: {e}", file=sys.stderr)
        return 2


def cmd_pull(a: argparse.Namespace) -> int:
    from ember.download import fetch_url, url_target
    from ember.fetch import models_dir
    from ember.hub import fetch

    by_url = a.ref.startswith(("http://", "https://"))
    if by_url and a.hf_file is not None:
        raise ModelFetchError("--hf-file names a file of a repository, not of a URL")
    try:
        if by_url:
            path = fetch_url(a.ref, url_target(a.ref, models_dir()))
        else:
            path = fetch(a.ref, file=a.hf_file, token=a.hf_token)
    except KeyboardInterrupt:
        print("\nember: stopped; the bytes fetched are kept, and the same command resumes from them", file=sys.stderr)
        return 130
    print(path)
    return 0


def cmd_list(a: argparse.Namespace) -> int:
    from ember.hub import cached_models

    models = cached_models()
    if not models:
        print("no models in the cache (ember pull OWNER/NAME[:QUANT] fetches one)", file=sys.stderr)
        return 0
    rows = [(f"{m.repo}:{m.quant}" if m.quant else m.repo, _human_bytes(m.size), m.quant or "-", m.architecture,
             m.file + (f" (+{m.parts - 1} parts)" if m.parts > 1 else "")) for m in models]
    head = ("MODEL", "SIZE", "QUANT", "ARCHITECTURE", "FILE")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def cmd_rm(a: argparse.Namespace) -> int:
    from ember.hub import remove

    gone = remove(a.ref)
    print(f"removed {len(gone)} file{'s' * (len(gone) != 1)} of {a.ref}")
    return 0


def _one_line_errors(p: argparse.ArgumentParser) -> None:
    """Usage mistakes end in one line on stderr and exit status 2, without the usage block."""

    def error(message: str):
        p.exit(2, f"{p.prog}: error: {message}\n")

    p.error = error  # type: ignore[method-assign]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ember", description="Local LLM inference on GGUF models.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="stream a completion, or chat with --chat")
    _add_model_args(run)
    _add_sampling_args(run)
    run.add_argument("-p", "--prompt", help="prompt text (default: read stdin)")
    run.add_argument("--chat", action="store_true", help="interactive chat using the model's chat template")
    run.add_argument("--system", help="system message for --chat")
    run.set_defaults(func=cmd_run)
    info = sub.add_parser("info", help="describe a GGUF file and what ember makes of it")
    info.add_argument("-m", "--model")
    info.set_defaults(func=cmd_info)
    bench = sub.add_parser("bench", help="measure prompt reading (ppN) and generation (tgN) rates, as llama-bench does")
    bench.add_argument("-m", "--model", help="GGUF model file (default: SmolLM2-135M-Instruct, fetched once)")
    bench.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens to read (0: skip the pp test)")
    bench.add_argument("-n", "--n-gen", type=int, default=128, help="tokens to generate (0: skip the tg test)")
    bench.add_argument("-r", "--repetitions", type=int, default=3, help="timed runs of each test, after one warm-up")
    bench.add_argument("-t", "--threads", type=int, default=0, help="worker threads (0: physical cores)")
    bench.add_argument("-b", "--batch-size", type=int, default=512, help="prompt tokens per forward pass")
    bench.add_argument("-d", "--n-depth", default="0",
                       help="tokens already in the context before each test, comma-separated for several (0,4096)")
    bench.add_argument("-ctk", "--cache-type", default="f16", help="KV cache type: f16 (default), bf16, q8_0 or f32")
    bench.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", default=None,
                       help="layers on the GPU: all puts every layer and the output head on the first card (the CPU "
                            "when there is none, said on stderr), 0 none")
    bench.add_argument("-dev", "--device", default=None,
                       help="the device to measure on, by its `ember serve --list-devices` name, or none")
    bench.add_argument("--json", action="store_true", help="one JSON object per line per test instead of a table")
    bench.set_defaults(func=cmd_bench, parser=bench)
    _one_line_errors(bench)
    pull = sub.add_parser("pull", help="fetch a model by name from the hub into its cache (OWNER/NAME[:QUANT]), "
                                       "or by URL into ember's")
    pull.add_argument("ref", metavar="OWNER/NAME[:QUANT]|URL")
    pull.add_argument("-hff", "--hf-file", help="the file to fetch, by name, instead of a quantization")
    pull.add_argument("-hft", "--hf-token", help="the hub's access token (default: HF_TOKEN)")
    pull.set_defaults(func=cmd_pull)
    lst = sub.add_parser("list", help="the models in the hub's cache: size, quantization, architecture")
    lst.set_defaults(func=cmd_list)
    rm = sub.add_parser("rm", help="remove a cached model (OWNER/NAME for all its files, :QUANT for one)")
    rm.add_argument("ref", metavar="OWNER/NAME[:QUANT]")
    rm.set_defaults(func=cmd_rm)
    # Listed here for `ember --help`; main() hands its arguments over before
    # argparse sees them, so llama-server's flags parse in one place.
    sub.add_parser("serve", help="serve a model over HTTP (llama-server's flags; see `ember serve --help`)", add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "serve":
        from ember.server.cli import main as serve_main

        return serve_main(argv[1:], prog="ember serve")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # What parse_args does, but told by the subcommand's parser where it has its own way.
        getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except EmberError as e:
        print(f"ember: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nember: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`ember info | head`): not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
