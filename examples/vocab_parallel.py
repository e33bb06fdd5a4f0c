"""Vocabulary-parallel speculative decoding: the target's LM head split over P processes.

    python examples/vocab_parallel.py                   # 2 gloo ranks on this machine (CPU)
    python examples/vocab_parallel.py --world 3 --k 4 --temperature 0.8 --seed 5

The bundled reference Llama target keeps only its rank's rows of the LM head
(``specdec_ext.distributed.split_lm_head``), so each rank's forward returns the logits of one
contiguous vocabulary shard, [B, K+1, V / P]; the bundled draft runs whole on every rank.
``specdec_ext.distributed.VocabParallelModel`` tells ``SpeculativeEngine`` so, and the engine
verifies with ``specdec_ext.distributed.verify``: the ranks exchange O(B * (K+1)) numbers per
step instead of the [B, K+1, V] logits. The script generates greedy and seeded text on the P
ranks and in one ordinary process and checks that every rank's text is the same as the single
process's (exit status 1 if not).
"""
from __future__ import annotations

import argparse
import sys

import torch

from specdec_ext import SpeculativeEngine, bundled
from specdec_ext import distributed as sd
from specdec_ext.distributed.launch import run_ranks


def generate(target, draft, args) -> dict:
    """{temperature: generated token ids} for 0 (greedy) and args.temperature (seeded)."""
    ids = torch.tensor([bundled.load_tokenizer().encode(args.prompt).ids])
    # token-wise verification in both: distributed.verify has no block rule (the engine's
    # default for a vocabulary-parallel target), and the single process must use the same rule
    engine = SpeculativeEngine(target, draft, k=args.k, adaptive_k=False, verify_mode="exact")
    return {t: engine.generate(ids, args.max_new_tokens, temperature=t, seed=args.seed).generated[0]
            for t in (0.0, args.temperature)}


def rank_main(rank: int, world: int, args) -> dict:
    """One rank: the target with this rank's shard of the LM head, the draft whole."""
    target, draft = bundled.load_pair(check=False)  # the parent checked the files
    shard = sd.VocabShard.even(target.config.vocab_size)
    sd.split_lm_head(target, shard)
    return generate(sd.VocabParallelModel(target, shard), draft, args)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2, help="processes (ranks) the LM head is split over")
    p.add_argument("--k", type=int, default=4, help="drafts per step")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.8, help="of the seeded run (the other is greedy)")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--prompt", default="def fibonacci(n):")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    single = generate(*bundled.load_pair(), args)
    ranks = run_ranks(rank_main, args.world, args, timeout_s=120)
    tok = bundled.load_tokenizer()
    same = True
    for t, ids in single.items():
        print(f"T = {t}: {tok.decode(ids)!r}")
        for r, out in enumerate(ranks):
            ok = out[t] == ids
            same = same and ok
            print(f"  rank {r} of {args.world}: {'same text' if ok else 'DIFFERENT: ' + repr(tok.decode(out[t]))}")
    print("every rank generated the single process's text" if same else "MISMATCH")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
