"""Train the bundled draft/target pair on the Python standard library's own source.

    python scripts/train_tiny_pair.py --out specdec_ext/assets/tiny_pair

Runs on the CPU of a 2-core machine in well under an hour (fixed seeds; the corpus is the
stdlib of the Python running the script, so the numbers depend on its version):

1. byte-level BPE tokenizer (``tokenizers``), 4096 tokens, trained on the corpus;
2. target: a small Llama (~3M parameters), next-token cross-entropy;
3. draft: a one-layer Llama (~6.5x fewer parameters) distilled from the target's distributions
   (KL(p || q)); one layer because small models cost mostly per-layer overhead;
4. prints held-out loss of both and the draft's acceptance rate against the target
   (alpha = E[sum_x min(p(x), q(x))] over held-out positions, temperature 1), and writes
   fp16 safetensors in Hugging Face Llama format (config.json, model.safetensors,
   tokenizer.json) plus a checksum file.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import sys
import sysconfig
import time

import torch
import torch.nn.functional as F

EOT = "<|endoftext|>"


def corpus_files():
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(f for f in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
                   if "site-packages" not in f and "/test" not in f and "idlelib" not in f)
    return root, files


def split(files):
    """Held-out: files whose path hash is 0 mod 20 (stable across runs)."""
    held = [f for f in files if int(hashlib.sha1(os.path.basename(f).encode()).hexdigest(), 16) % 20 == 0]
    train = [f for f in files if f not in set(held)]
    return train, held


def read(f):
    with open(f, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def train_tokenizer(files, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((read(f) for f in files), trainer=trainer)
    return tok


def encode(tok, files):
    eot = tok.token_to_id(EOT)
    ids = []
    for enc in tok.encode_batch([read(f) for f in files]):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.int64)


def llama(vocab, hidden, layers, heads, kv_heads, inter, seq):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=2048,
                      tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=10000.0,
                      bos_token_id=None, eos_token_id=0, pad_token_id=0)
    return LlamaForCausalLM(cfg)


def batches(data, batch, seq, steps, gen):
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
        x = torch.stack([data[s:s + seq + 1] for s in starts.tolist()])
        yield x[:, :-1], x[:, 1:]


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


@torch.no_grad()
def evaluate(target, draft, data, seq, n_batches=8):
    """Held-out CE of both models and alpha = E[sum_x min(p, q)] at temperature 1."""
    gen = torch.Generator().manual_seed(123)
    ce_t = ce_d = alpha = 0.0
    for x, y in batches(data, 8, seq, n_batches, gen):
        lt = target(x).logits.float()
        ld = draft(x).logits.float()
        ce_t += F.cross_entropy(lt.flatten(0, 1), y.flatten()).item()
        ce_d += F.cross_entropy(ld.flatten(0, 1), y.flatten()).item()
        alpha += torch.minimum(lt.softmax(-1), ld.softmax(-1)).sum(-1).mean().item()
    return ce_t / n_batches, ce_d / n_batches, alpha / n_batches


def train(model, data, steps, batch, seq, lr, teacher=None, log_every=100, name="model"):
    gen = torch.Generator().manual_seed(1 if teacher is None else 2)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    t0 = time.time()
    model.train()
    for step, (x, y) in enumerate(batches(data, batch, seq, steps, gen)):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup=max(1, steps // 20))
        logits = model(x).logits
        if teacher is None:
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        else:
            with torch.no_grad():
                p = teacher(x).logits.float().log_softmax(-1)
            loss = F.kl_div(logits.float().log_softmax(-1).flatten(0, 1), p.flatten(0, 1), log_target=True,
                            reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == steps - 1:
            print(f"  {name} step {step:4d}/{steps} loss {loss.item():.3f} ({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    return model


def save(model, tok, out_dir, meta):
    os.makedirs(out_dir, exist_ok=True)
    model.half().save_pretrained(out_dir, safe_serialization=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "training.json"), "w") as f:
        json.dump(meta, f, indent=1)


def write_checksums(out):
    sums = {}
    for root, _, files in os.walk(out):
        for f in sorted(files):
            if f == "checksums.json":
                continue
            path = os.path.join(root, f)
            with open(path, "rb") as fh:
                sums[os.path.relpath(path, out)] = hashlib.sha256(fh.read()).hexdigest()
    with open(os.path.join(out, "checksums.json"), "w") as f:
        json.dump(sums, f, indent=1, sort_keys=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="specdec_ext/assets/tiny_pair")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--target-steps", type=int, default=2000)
    ap.add_argument("--draft-steps", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    ap.add_argument("--target-from", metavar="DIR",
                    help="skip the tokenizer and target stages: load both from a pair directory written by this "
                         "script (e.g. specdec_ext/assets/tiny_pair) and train only the draft")
    ap.add_argument("--draft-hidden", type=int, default=96)
    ap.add_argument("--draft-layers", type=int, default=1)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    t_start = time.time()
    root, files = corpus_files()
    train_files, held_files = split(files)
    print(f"corpus: {len(train_files)} train / {len(held_files)} held-out files from {root} "
          f"(Python {sys.version.split()[0]})", flush=True)
    if args.target_from:
        from tokenizers import Tokenizer
        from transformers import LlamaForCausalLM

        tok = Tokenizer.from_file(os.path.join(args.target_from, "target", "tokenizer.json"))
    else:
        tok = train_tokenizer(train_files, args.vocab)
    train_ids, held_ids = encode(tok, train_files), encode(tok, held_files)
    print(f"tokenizer: {tok.get_vocab_size()} tokens; {len(train_ids)} train / {len(held_ids)} held-out tokens "
          f"({time.time() - t_start:.0f}s)", flush=True)

    target = llama(args.vocab, hidden=192, layers=6, heads=4, kv_heads=2, inter=512, seq=args.seq)
    # A one-layer draft: on small models a forward costs mostly per-layer overhead, so the
    # draft's cost relative to the target is set by its depth more than by its width.
    draft = llama(args.vocab, hidden=args.draft_hidden, layers=args.draft_layers, heads=2, kv_heads=1,
                  inter=args.draft_hidden * 8 // 3 // 16 * 16, seq=args.seq)
    n_t = sum(p.numel() for p in target.parameters())
    n_d = sum(p.numel() for p in draft.parameters())
    print(f"target {n_t / 1e6:.2f}M parameters, draft {n_d / 1e6:.2f}M ({n_t / n_d:.1f}x fewer)", flush=True)

    if args.target_from:
        target = LlamaForCausalLM.from_pretrained(os.path.join(args.target_from, "target"), dtype=torch.float32)
        print(f"target loaded from {args.target_from} (not retrained)", flush=True)
    else:
        train(target, train_ids, args.target_steps, args.batch, args.seq, lr=3e-3, name="target")
        # The shipped target is fp16: distil the draft from exactly those weights.
        target = target.half().float()
    target.eval()
    train(draft, train_ids, args.draft_steps, args.batch, args.seq, lr=5e-3, teacher=target, name="draft")
    ce_t, ce_d, alpha = evaluate(target, draft, held_ids, args.seq)
    elapsed = time.time() - t_start
    print(f"held-out loss: target {ce_t:.3f}, draft {ce_d:.3f}; draft acceptance rate vs target "
          f"(T=1) alpha = {alpha:.3f}; total {elapsed / 60:.1f} min", flush=True)
    meta = dict(python=sys.version.split()[0], torch=torch.__version__, seed=0, vocab=args.vocab, seq=args.seq,
                batch=args.batch, target_steps=None if args.target_from else args.target_steps,
                target_from=args.target_from, draft_steps=args.draft_steps, draft_hidden=args.draft_hidden,
                draft_layers=args.draft_layers,
                target_params=n_t, draft_params=n_d, heldout_loss_target=ce_t, heldout_loss_draft=ce_d,
                alpha_t1=alpha, minutes=elapsed / 60)
    save(target, tok, os.path.join(args.out, "target"), meta)
    save(draft, tok, os.path.join(args.out, "draft"), meta)
    write_checksums(args.out)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
