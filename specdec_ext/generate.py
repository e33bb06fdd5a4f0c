"""python -m specdec_ext.generate: speculative decoding from the command line.

    python -m specdec_ext.generate --prompt "def fibonacci(n):"          # the bundled pair
    python -m specdec_ext.generate --target DIR --draft DIR --prompt-ids 1 2 3 [--k 5] [--fixed-k]

With no --target / --draft the pair shipped with the package is used (offline) and a
text --prompt is tokenized with its tokenizer; DIR is any Hugging Face Llama checkpoint
directory (config.json + *.safetensors), loaded by the package's reference model (or by
transformers with --hf). Generation stops at the model's end-of-text token (the bundled
pair's <|endoftext|>, or config.json's eos_token_id; --eos-id overrides, --ignore-eos
disables). Prints the continuation (text when a tokenizer is known, else ids) and a
summary line: acceptance rate, tokens per step, tokens/s and the speedup over
target-only decoding of the same prompt (skip that run with --no-baseline).
--top-k / --top-p / --min-p filter the sampling law (Hugging Face's warper order; ignored
when greedy); --coupled keys every token by (seed, position) so the text equals target-only
sampling with the same --seed, whatever K or the drafter. --metrics-port serves Prometheus
metrics while it runs.

Arguments are checked before any model is loaded; a bad one is a one-line error.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import torch

from ._validate import check_filter, check_temperature
from .engine import SpecDecMetrics, SpeculativeEngine


def load_model(path: str, device: str, dtype: torch.dtype, hf: bool):
    """A checkpoint directory -> a model the engine accepts."""
    if hf:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype).to(device).eval()
    from .models.llama import LlamaModel

    return LlamaModel.from_pretrained(path, dtype=dtype, device=device)


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    return parse


def _temperature(text: str) -> float:
    try:
        return check_temperature(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _filter(name: str, parse):
    """argparse type of one sampling filter, checked by the ops' rule (check_filter)."""
    def check(text: str):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if parse is int else 'a number'}, "
                                             f"got {text!r}") from None
        try:
            return check_filter(name, value)
        except (TypeError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e).replace(" or a tensor [B]", "")) from None
    return check


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block): ``prog: error: ... (see --help)``."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m specdec_ext.generate", description=__doc__,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="target checkpoint directory (default: the bundled pair)")
    ap.add_argument("--draft", help="draft checkpoint directory (default: the bundled pair)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (bundled pair's tokenizer, or DIR/tokenizer.json)")
    src.add_argument("--prompt-ids", type=_int_at_least(0), nargs="+", help="prompt token ids")
    ap.add_argument("--max-new-tokens", type=_int_at_least(0), default=128)
    ap.add_argument("--no-baseline", action="store_true", help="skip the target-only run (no speedup figure)")
    ap.add_argument("--k", type=_int_at_least(0), default=5, help="drafts per step (the maximum when adapting)")
    ap.add_argument("--adaptive", nargs="?", const="cost", default="cost", choices=["cost", "threshold"],
                    help="adapt K in [0, k] (default: the cost model; 'threshold' = the simple rule)")
    ap.add_argument("--fixed-k", action="store_true", help="always draft exactly --k tokens (no adaptation)")
    ap.add_argument("--drafter", choices=["model", "ngram", "hybrid"], default="ngram",
                    help="where drafts come from: the draft model, prompt lookup (n-gram) in the prompt and "
                         "output (default: measured fastest on the bundled pair), or n-gram where a match "
                         "exists and the model elsewhere")
    ap.add_argument("--max-ngram", type=_int_at_least(1), default=3, help="longest suffix n-gram matched")
    ap.add_argument("--temperature", type=_temperature, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-k", type=_filter("top_k", int), default=None, help="keep the k most likely tokens (0 = off)")
    ap.add_argument("--top-p", type=_filter("top_p", float), default=None, help="nucleus sampling, in (0, 1] (1 = off)")
    ap.add_argument("--min-p", type=_filter("min_p", float), default=None,
                    help="keep tokens with p >= min_p * max p, in [0, 1) (0 = off)")
    ap.add_argument("--coupled", action="store_true",
                    help="coupled verification: the text equals target-only sampling with the same --seed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eos-id", type=_int_at_least(0), default=None, help="end-of-text id (default: the model's)")
    ap.add_argument("--ignore-eos", action="store_true", help="do not stop at end-of-text")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--hf", action="store_true", help="load with transformers instead of the reference model")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the decode steps of both models (reference model, with its weights frozen "
                         "into the graphs, or --hf on the batched HF path; the first steps compile for seconds)")
    ap.add_argument("--metrics-port", type=_int_at_least(0), default=None,
                    help="serve /metrics on this port while running")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def _target_config(args) -> dict:
    from . import bundled

    path = os.path.join(args.target or bundled.pair_dir("target"), "config.json")
    with open(path) as f:
        return json.load(f)


def check_args(ap: argparse.ArgumentParser, args) -> dict:
    """Everything that can be checked before loading a model (``ap.error`` on a problem).
    Returns the target's config.json."""
    if (args.target is None) != (args.draft is None):
        ap.error("give both --target and --draft, or neither (the bundled pair)")
    for name in ("target", "draft"):
        d = getattr(args, name)
        if d is not None and not os.path.isfile(os.path.join(d, "config.json")):
            ap.error(f"--{name} {d}: not a checkpoint directory (no config.json there)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: no CUDA device is available")
    cfg = _target_config(args)
    V = int(cfg.get("vocab_size", 0))
    if args.prompt_ids is not None and V and max(args.prompt_ids) >= V:
        ap.error(f"--prompt-ids: id {max(args.prompt_ids)} is outside the vocabulary [0, {V})")
    if args.eos_id is not None and V and args.eos_id >= V:
        ap.error(f"--eos-id {args.eos_id} is outside the vocabulary [0, {V})")
    if args.prompt is not None and not os.path.exists(_tokenizer_path(args)):
        ap.error(f"--prompt needs a tokenizer: {_tokenizer_path(args)} not found (use --prompt-ids)")
    if args.prompt is not None and not args.prompt:
        ap.error("--prompt is empty")
    if args.metrics_port is not None:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", args.metrics_port))
        except OSError as e:
            ap.error(f"--metrics-port {args.metrics_port}: cannot listen there ({e.strerror})")
    return cfg


def _tokenizer_path(args) -> str:
    from . import bundled

    return os.path.join(args.target or bundled.pair_dir("target"), "tokenizer.json")


def _eos(args, cfg: dict):
    """The end-of-text id(s) generation stops at, or None."""
    if args.ignore_eos:
        return None
    if args.eos_id is not None:
        return args.eos_id
    if args.target is None:
        from . import bundled

        return bundled.eos_token_id()
    return cfg.get("eos_token_id")


def _load(args):
    from . import bundled

    dtype = getattr(torch, args.dtype)
    if args.target is None:
        bundled.verify_checksums()
        return bundled.load_pair(device=args.device, dtype=dtype, implementation="hf" if args.hf else "reference",
                                 check=False)
    return load_model(args.target, args.device, dtype, args.hf), load_model(args.draft, args.device, dtype, args.hf)


def _compiled(model):
    """The model with torch.compile'd decode steps: the reference model itself, with its
    weights frozen into the graphs (they do not change here), or a transformers model on
    its batched SpecModel (the per-row HF path cannot compile)."""
    from .models.llama import LlamaModel

    if isinstance(model, LlamaModel):
        return model.compile_decode(freeze=True)
    if not hasattr(model, "compile_decode"):
        from .models import adapt

        model = adapt(model)
        if not hasattr(model, "compile_decode"):
            raise SystemExit(f"error: --compile needs the batched HF path, which {type(model).__name__} is not")
    return model.compile_decode()


def progress_bar(total: int, enabled: bool):
    """A tqdm bar (stderr) when available and wanted, else a no-op callable."""
    if not enabled:
        return None, lambda done: None
    try:
        from tqdm import tqdm
    except ImportError:
        return None, lambda done: None
    bar = tqdm(total=total, unit="tok", file=sys.stderr, leave=False)

    def update(done: int):
        bar.update(done - bar.n)

    return bar, update


def _sampling(args) -> dict:
    """generate()'s sampling keyword arguments from the flags: temperature, seed, top_k,
    top_p, min_p (the same for the timed run, its warm-ups and the baseline)."""
    return dict(temperature=args.temperature, seed=args.seed, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)


def _mode(args) -> str:
    return "coupled" if args.coupled else "exact"


def _timed(engine, ids, args, eos, progress=None):
    t0 = time.perf_counter()
    out = engine.generate(ids, args.max_new_tokens, eos_token_id=eos, progress=progress, **_sampling(args))
    return out, time.perf_counter() - t0


def run(args, cfg: dict) -> int:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(_tokenizer_path(args)) if args.prompt is not None else None
    prompt_ids = tok.encode(args.prompt).ids if tok is not None else args.prompt_ids
    if not prompt_ids:
        raise SystemExit("error: the prompt encodes to no tokens")
    eos = _eos(args, cfg)
    target, draft = _load(args)
    if args.compile:
        target, draft = _compiled(target), _compiled(draft)
    metrics = SpecDecMetrics(engine="cli") if args.metrics_port is not None else None
    server = metrics.serve(args.metrics_port) if metrics else None
    engine = SpeculativeEngine(target, None if args.drafter == "ngram" else draft, k=args.k,
                               adaptive_k=False if args.fixed_k else args.adaptive, metrics=metrics,
                               drafter="auto" if args.drafter == "ngram" else args.drafter, max_ngram=args.max_ngram,
                               verify_mode=_mode(args))
    ids = torch.tensor([prompt_ids], dtype=torch.int64)
    # Warm-up; with --compile the whole request, so every step kind compiles outside the timing.
    warm = args.max_new_tokens if args.compile else min(4, args.max_new_tokens)
    engine.generate(ids, warm, **_sampling(args))
    bar, update = progress_bar(args.max_new_tokens, not args.no_progress and args.max_new_tokens >= 32)
    out, elapsed = _timed(engine, ids, args, eos, update)
    if bar is not None:
        bar.close()
    st = out.stats[0]
    tok_s = st.tokens_generated / elapsed if elapsed > 0 else 0.0
    speed = ""
    if not args.no_baseline:
        plain = SpeculativeEngine(target, None, k=0, adaptive_k=False, verify_mode=_mode(args))
        plain.generate(ids, min(4, args.max_new_tokens), **_sampling(args))  # warm-up (compiles under --compile)
        base, base_s = _timed(plain, ids, args, eos)
        base_tok_s = base.stats[0].tokens_generated / base_s if base_s > 0 else 0.0
        ratio = f"{tok_s / base_tok_s:.2f}x" if base_tok_s > 0 else "n/a (no tokens)"
        speed = f" | target-only {base_tok_s:.1f} tokens/s -> speedup {ratio}"
    print(args.prompt + tok.decode(out.generated[0]) if tok is not None else " ".join(map(str, out.generated[0])))
    print(f"acceptance {st.acceptance_rate:.1%} (alpha {st.alpha:.2f}) | tokens/step {st.tokens_per_step:.2f} | "
          f"{st.tokens_generated} tokens in {elapsed:.2f}s = {tok_s:.1f} tokens/s{speed}")
    if server is not None:
        server.shutdown()
    return 0


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    cfg = check_args(ap, args)
    return run(args, cfg)


if __name__ == "__main__":
    sys.exit(main())
