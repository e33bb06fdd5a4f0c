"""python -m specdec_ext.generate: speculative decoding from the command line.

    python -m specdec_ext.generate --target DIR --draft DIR --prompt-ids 1 2 3 [--k 5] [--adaptive]

DIR is a Hugging Face Llama checkpoint directory (config.json + *.safetensors), loaded
offline by the package's reference model (or by transformers with --hf). Prints the
generated ids and a one-line summary (acceptance rate, tokens per step, tokens/s);
--metrics-port serves Prometheus metrics while it runs.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from .engine import SpeculativeEngine
from .metrics import SpecDecMetrics


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
    ap.add_argument("--target", required=True, help="target checkpoint directory")
    ap.add_argument("--draft", required=True, help="draft checkpoint directory")
    ap.add_argument("--prompt-ids", type=int, nargs="+", required=True, help="prompt token ids")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=5, help="drafts per step (the maximum with --adaptive)")
    ap.add_argument("--adaptive", nargs="?", const="cost", default=None, choices=["cost", "threshold"],
                    help="adapt K (default policy: cost model)")
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


def run(args) -> int:
    dtype = getattr(torch, args.dtype)
    target = load_model(args.target, args.device, dtype, args.hf)
    draft = load_model(args.draft, args.device, dtype, args.hf)
    metrics = SpecDecMetrics(engine="cli") if args.metrics_port is not None else None
    server = metrics.serve(args.metrics_port) if metrics else None
    engine = SpeculativeEngine(target, draft, k=args.k, adaptive_k=args.adaptive or False, metrics=metrics)
    ids = torch.tensor([args.prompt_ids], dtype=torch.int64)
    bar, update = progress_bar(args.max_new_tokens, not args.no_progress and args.max_new_tokens >= 32)
    t0 = time.perf_counter()
    out = engine.generate(ids, args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                          eos_token_id=args.eos_id, progress=update)
    elapsed = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    st = out.stats[0]
    print(" ".join(str(t) for t in out.generated[0]))
    print(f"acceptance {st.acceptance_rate:.2%} | tokens/step {st.tokens_per_step:.2f} | "
          f"{st.tokens_generated} tokens in {elapsed:.2f}s = {st.tokens_generated / elapsed:.1f} tokens/s")
    if server is not None:
        server.shutdown()
    return 0


def main(argv=None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
