"""Train the bundled pair's draft head (specdec_ext.models.DraftHead) on the target's features.

    python scripts/train_draft_head.py                 # writes specdec_ext/assets/tiny_pair/head

The target (the bundled one, loaded by the reference model as the engine runs it) reads its
training corpus (scripts/train_tiny_pair.py's files, shuffled with a fixed seed) in windows of
--seq tokens; at each position t its final hidden state h_t, the next corpus token x_(t+1) and
its own greedy predictions g are kept. The head learns, from (h_t, x_(t+1)), to predict
g_(t+2), then from its own feature and x_(t+2) to predict g_(t+3), and so on for --depth
steps (cross-entropy through the target's frozen final norm and lm_head; the drafts are
judged against what the target would emit, not against the corpus). Held-out files give the
per-depth top-1 agreement printed at the end and stored in training.json. About 10 minutes on
2 cores with the defaults. The head drafts only the --draft-vocab most frequent tokens of the
training text (DraftHead.set_draft_vocab: a quarter of the lm_head read per draft at 1024).
Then the pair's checksums.json is rewritten. ``--vocab-only`` recomputes the draft vocabulary
of the head already under --out (no training).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_tiny_pair import corpus_files, encode, split, write_checksums  # noqa: E402

from specdec_ext import bundled  # noqa: E402
from specdec_ext.models.draft_head import DraftHead  # noqa: E402


@torch.no_grad()
def features(target, ids: torch.Tensor, seq: int):
    """ids [N] int64 -> (h [M, H] float32, tokens [M] int64, greedy [M] int64), M = whole windows."""
    target.keep_hidden = True
    hs, xs, gs = [], [], []
    for s in range(0, len(ids) - seq + 1, seq):
        x = ids[s:s + seq].view(1, seq)
        logits = target(x)  # no cache: positions 0 .. seq - 1
        hs.append(target.last_hidden[0].float())
        xs.append(x[0])
        gs.append(logits[0].argmax(-1))
    target.keep_hidden = False
    return torch.cat(hs), torch.cat(xs), torch.cat(gs)


def chain_loss(head, h, x, g, idx, depth):
    """Summed cross-entropy over ``depth`` recurrence steps from positions ``idx``, and the
    per-step hits [depth] of [len(idx)] bool. Windows are cut at ``seq``: idx stays clear of their ends."""
    f, loss, hits = h[idx], 0.0, []
    for j in range(depth):
        f = head.step(f, x[idx + 1 + j])
        lg = head.logits(f)
        loss = loss + F.cross_entropy(lg, g[idx + 1 + j])
        hits.append(lg.argmax(-1) == g[idx + 1 + j])
    return loss, hits


def draft_vocab(ids: torch.Tensor, vocab_size: int, n: int):
    """The ``n`` most frequent ids of ``ids`` [N] int64, ascending (None when n is 0 or >= V)."""
    if n <= 0 or n >= vocab_size:
        return None
    counts = torch.bincount(ids, minlength=vocab_size)
    return counts.argsort(descending=True, stable=True)[:n].sort().values


def positions(n: int, seq: int, depth: int) -> torch.Tensor:
    """Positions t whose t + depth + 1 stays in t's window."""
    t = torch.arange(n)
    return t[(t % seq) < seq - depth - 1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(bundled.PAIR_DIR, "head"))
    ap.add_argument("--tokens", type=int, default=600_000, help="training corpus tokens")
    ap.add_argument("--held-tokens", type=int, default=60_000)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--depth", type=int, default=3, help="recurrence steps trained")
    ap.add_argument("--inner", type=int, default=512, help="the head's intermediate size")
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--draft-vocab", type=int, default=1024, help="tokens the head may draft (0: all)")
    ap.add_argument("--vocab-only", action="store_true", help="only recompute the draft vocabulary of the head "
                                                                 "under --out")
    ap.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    tok = bundled.load_tokenizer()
    _, files = corpus_files()
    train_files, held_files = split(files)
    random.Random(0).shuffle(train_files)
    target, _ = bundled.load_pair()
    train_ids = encode(tok, train_files[:400])[:args.tokens]
    vocab = draft_vocab(train_ids, target.vocab_size, args.draft_vocab)
    if args.vocab_only:
        head = DraftHead.from_pretrained(args.out, target)
        head.set_draft_vocab(vocab)
        head.save_pretrained(args.out)
        write_checksums(os.path.dirname(os.path.abspath(args.out)))
        print(f"wrote the draft vocabulary of {args.out}", flush=True)
        return
    held_ids = encode(tok, held_files[:40])[:args.held_tokens]
    h, x, g = features(target, train_ids, args.seq)
    hh, xh, gh = features(target, held_ids, args.seq)
    print(f"features: {len(h)} train / {len(hh)} held-out positions ({time.time() - t0:.0f}s)", flush=True)

    head = DraftHead(target, args.inner)
    for p in head.parameters():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    train_pos, held_pos = positions(len(h), args.seq, args.depth), positions(len(hh), args.seq, args.depth)
    gen = torch.Generator().manual_seed(0)
    for s in range(args.steps):
        for group in opt.param_groups:  # warm-up, then linear decay
            group["lr"] = args.lr * min(1.0, (s + 1) / 100) * (1 - s / args.steps)
        idx = train_pos[torch.randint(0, len(train_pos), (args.batch,), generator=gen)]
        loss, _ = chain_loss(head, h, x, g, idx, args.depth)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if s % 1000 == 0:
            print(f"step {s}: loss {loss.item():.3f} ({time.time() - t0:.0f}s)", flush=True)
    with torch.no_grad():
        _, hits = chain_loss(head, hh, xh, gh, held_pos, args.depth)
    agree = [round(v.float().mean().item(), 4) for v in hits]
    run, chain = torch.ones_like(hits[0]), []
    for v in hits:
        run = run & v
        chain.append(round(run.float().mean().item(), 4))
    print(f"held-out top-1 agreement with the target per depth {agree}, whole chain {chain}", flush=True)
    head.requires_grad_(False)
    head.set_draft_vocab(vocab)
    meta = {"depth": args.depth, "held_out_agreement": agree, "held_out_chain": chain, "tokens": len(h),
            "steps": args.steps, "batch": args.batch, "lr": args.lr, "seq": args.seq,
            "python": sys.version.split()[0], "torch": torch.__version__}
    head.save_pretrained(args.out)
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    write_checksums(os.path.dirname(os.path.abspath(args.out)))
    print(f"wrote {args.out} ({time.time() - t0:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
