"""python -m specdec_ext.generate: speculative decoding from the command line.

    python -m specdec_ext.generate --prompt "def fibonacci(n):"          # the bundled pair
    python -m specdec_ext.generate --target DIR --draft DIR --prompt-ids 1 2 3 [--k 5] [--adaptive]

With no --target / --draft the pair shipped with the package is used (offline) and a
text --prompt is tokenized with its tokenizer; DIR is any Hugging Face Llama checkpoint
directory (config.json + *.safetensors), loaded by the package's reference model (or by
transformers with --hf). Prints the continuation (text for the bundled pair, else ids)
and a summary line: acceptance rate, tokens per step, tokens/s and the speedup over
target-only decoding of the same prompt (skip that run with --no-baseline).
--metrics-port serves Prometheus metrics while it runs.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from .engine import SpeculativeEngine
from .engine import SpecDecMetrics


def load_model(path: str, device: str, dtype: torch.dtype, hf: bool):
    """A checkpoint directory -> a model the engine accepts."""
    if hf:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype).to(device).eval()
    from .models.llama import LlamaModel

    return LlamaModel.from_pretrained(path, dtype=dtype, device=device)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m specdec_ext.generate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="target checkpoint directory (default: the bundled pair)")
    ap.add_argument("--draft", help="draft checkpoint directory (default: the bundled pair)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (bundled pair's tokenizer, or DIR/tokenizer.json)")
    src.add_argument("--prompt-ids", type=int, nargs="+", help="prompt token ids")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--no-baseline", action="store_true", help="skip the target-only run (no speedup figure)")
    ap.add_argument("--k", type=int, default=5, help="drafts per step (the maximum with --adaptive)")
    ap.add_argument("--adaptive", nargs="?", const="cost", default="cost", choices=["cost", "threshold"],
                    help="adapt K in [0, k] (default: the cost model; 'threshold' = the simple rule)")
    ap.add_argument("--fixed-k", action="store_true", help="always draft exactly --k tokens (no adaptation)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eos-id", type=int, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--hf", action="store_true", help="load with transformers instead of the reference model")
    ap.add_argument("--metrics-port", type=int, default=None, help="serve /metrics on this port while running")
    ap.add_argument("--no-progress", action="store_true")
    return ap


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


def _tokenizer(args):
    import os

    from tokenizers import Tokenizer

    from . import bundled

    path = os.path.join(args.target, "tokenizer.json") if args.target else os.path.join(bundled.pair_dir("target"),
                                                                                        "tokenizer.json")
    if not os.path.exists(path):
        raise SystemExit(f"--prompt needs a tokenizer: {path} not found (use --prompt-ids)")
    return Tokenizer.from_file(path)


def run(args) -> int:
    from . import bundled

    if (args.target is None) != (args.draft is None):
        raise SystemExit("give both --target and --draft, or neither (the bundled pair)")
    dtype = getattr(torch, args.dtype)
    if args.target is None:
        bundled.verify_checksums()
        target, draft = bundled.load_pair(device=args.device, dtype=dtype,
                                          implementation="hf" if args.hf else "reference", check=False)
        eos = args.eos_id
    else:
        target = load_model(args.target, args.device, dtype, args.hf)
        draft = load_model(args.draft, args.device, dtype, args.hf)
        eos = args.eos_id
    tok = _tokenizer(args) if args.prompt is not None else None
    prompt_ids = tok.encode(args.prompt).ids if tok is not None else args.prompt_ids
    if not prompt_ids:
        raise SystemExit("the prompt is empty")
    metrics = SpecDecMetrics(engine="cli") if args.metrics_port is not None else None
    server = metrics.serve(args.metrics_port) if metrics else None
    engine = SpeculativeEngine(target, draft, k=args.k, adaptive_k=False if args.fixed_k else args.adaptive,
                               metrics=metrics)
    ids = torch.tensor([prompt_ids], dtype=torch.int64)
    engine.generate(ids, 4, temperature=args.temperature, seed=args.seed)  # warm-up (allocations, kernels)
    bar, update = progress_bar(args.max_new_tokens, not args.no_progress and args.max_new_tokens >= 32)
    t0 = time.perf_counter()
    out = engine.generate(ids, args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                          eos_token_id=eos, progress=update)
    elapsed = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    st = out.stats[0]
    tok_s = st.tokens_generated / elapsed
    speed = ""
    if not args.no_baseline:
        plain = SpeculativeEngine(target, draft, k=0, adaptive_k=False)
        t0 = time.perf_counter()
        base = plain.generate(ids, args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                              eos_token_id=eos)
        base_tok_s = base.stats[0].tokens_generated / (time.perf_counter() - t0)
        speed = f" | target-only {base_tok_s:.1f} tokens/s -> speedup {tok_s / base_tok_s:.2f}x"
    if tok is not None:
        print(args.prompt + tok.decode(out.generated[0]))
    else:
        print(" ".join(str(t) for t in out.generated[0]))
    print(f"acceptance {st.acceptance_rate:.1%} (alpha {st.alpha:.2f}) | tokens/step {st.tokens_per_step:.2f} | "
          f"{st.tokens_generated} tokens in {elapsed:.2f}s = {tok_s:.1f} tokens/s{speed}")
    if server is not None:
        server.shutdown()
    return 0


def main(argv=None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
