"""Acceptance of the engine's verify modes ("exact", "coupled", "block") on the bundled pair
(draft model, fixed K).

    python scripts/coupled_acceptance.py [--k 4] [--temperature 1] [--top-p 1] [--rows 16] [--tokens 64]
                                         [--modes exact,coupled,block]

Each row is one prompt with its own seed (the same seeds in both modes); prints, per mode,
the acceptance rate (accepted / drafted), alpha (accepted / tested) and tokens per step.
"""
import argparse

import torch

from specdec_ext import SpeculativeEngine, bundled

PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:\n    def __init__(self):", "for i in range(",
           "    return self.", "def parse(text):\n    \"\"\"", "if __name__ == ", "try:\n    import "]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=None)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--modes", default="exact,coupled,block", help="comma-separated verify modes")
    args = ap.parse_args()
    target, draft = bundled.load_pair()
    tok = bundled.load_tokenizer()
    prompts = [tok.encode(PROMPTS[r % len(PROMPTS)]).ids for r in range(args.rows)]
    width = max(len(p) for p in prompts)
    ids = torch.zeros(args.rows, width, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):], mask[r, width - len(p):] = torch.tensor(p), 1
    seeds = torch.arange(1000, 1000 + args.rows, dtype=torch.int64)
    for mode in args.modes.split(","):
        eng = SpeculativeEngine(target, draft, k=args.k, adaptive_k=False, verify_mode=mode)
        out = eng.generate(ids, args.tokens, temperature=args.temperature, top_p=args.top_p, seed=seeds,
                           attention_mask=mask)
        acc, drafted = sum(s.accepted for s in out.stats), sum(s.drafted for s in out.stats)
        tested = acc + sum(s.rejections for s in out.stats)
        steps, emitted = sum(s.steps for s in out.stats), sum(s.tokens_generated for s in out.stats)
        print(f"{mode:8s} K={args.k} T={args.temperature} top_p={args.top_p}: acceptance {acc / drafted:.1%} "
              f"alpha {acc / tested:.3f} tokens/step {emitted / steps:.2f} ({args.rows} rows x {args.tokens} tokens)")


if __name__ == "__main__":
    main()
