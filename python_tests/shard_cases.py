"""Inputs and rank functions of the vocabulary-parallel tests (test_distributed.py): the
stages of ``torch.ops.specdec.verify_shard`` run for every rank in ONE process (the gather is
a list), and module-level functions that spawned ranks run through
``specdec_ext.distributed.launch.run_ranks``."""
from __future__ import annotations

import functools

import torch

import specdec_ext
from specdec_ext import distributed as sd
from specdec_ext.ops._args import filter_args

OPS = torch.ops.specdec


def simulate(logits, ids, probs, temperature, seed, offset, bounds, num_drafts=None, coupled=False, top_k=None,
             top_p=None, min_p=None, ops=OPS):
    """verify_shard's steps for every shard of ``bounds`` in one process (what
    specdec_ext.distributed does over P processes). Returns one VerifyResult per rank.
    ops: where verify_shard / verify_shard_finish run (torch.ops.specdec, or a backends.py
    backend: the CUDA kernels, emulated or on a GPU)."""
    P = len(bounds) - 1
    t = temperature if isinstance(temperature, torch.Tensor) else torch.tensor(float(temperature))
    seed = seed if isinstance(seed, torch.Tensor) else torch.tensor(seed)
    offset = offset if isinstance(offset, torch.Tensor) else torch.tensor(offset)
    filters = filter_args(top_k, top_p, min_p)

    def args(r):
        s, e = bounds[r], bounds[r + 1]
        return (logits[..., s:e], ids, None if probs is None else probs[..., s:e], t, seed, offset, *filters,
                num_drafts, coupled, bounds, r)

    steps = int(ops.verify_shard(*args(0), 0, [])[0])
    gathered = []
    for stage in range(1, steps + 1):
        gathered = gathered + [ops.verify_shard(*args(r), stage, gathered) for r in range(P)]
    return [specdec_ext.VerifyResult(*ops.verify_shard_finish(*args(r), gathered)) for r in range(P)]


def random_case(g: torch.Generator, V: int, dtype=torch.float32):
    """A random verify call mixing every kind of row: sampled / greedy rows (per-row T), per-row
    num_drafts, drafts that are often the target's top token (so positions get accepted)."""
    B = int(torch.randint(1, 7, (), generator=g))
    K = int(torch.randint(0, 5, (), generator=g))
    scale = float(torch.empty(()).uniform_(0.5, 6.0, generator=g))
    logits = (torch.randn(B, K + 1, V, generator=g) * scale).to(dtype)
    q = torch.softmax(logits[:, :K].float() + torch.randn(B, K, V, generator=g), -1).to(dtype)
    ids = torch.multinomial(q.float().reshape(-1, V), 1, generator=g).view(B, K) if K else \
        torch.empty(B, 0, dtype=torch.int64)
    top = logits[:, :K].float().argmax(-1)
    take_top = torch.rand(B, K, generator=g) < 0.4
    ids = torch.where(take_top, top, ids)
    T = torch.empty(B).uniform_(0.3, 1.5, generator=g)
    T[torch.rand(B, generator=g) < 0.2] = 0.0
    n = torch.randint(0, K + 1, (B,), generator=g)
    return dict(logits=logits, ids=ids, q=q, T=T, num_drafts=n, seed=torch.randint(0, 2**40, (B,), generator=g),
                offset=int(torch.randint(0, 1000, (), generator=g)))


# ---- rank functions (run_ranks): fn(rank, world, *args) -> a picklable result ----

def rank_identity(rank, world, bounds, cases, seed, group=None, ref=specdec_ext, host_group=None):
    """Random calls of sd.verify / sd.sample, each compared with the single-device op (of
    ``ref``: verify and sample) on the full logits; returns (mismatches, this rank's tokens of
    every call, counted collectives)."""
    verify = functools.partial(sd.verify, group=group, host_group=host_group)
    sample = functools.partial(sd.sample, group=group, host_group=host_group)
    g = torch.Generator().manual_seed(seed)
    s, e = bounds[rank], bounds[rank + 1]
    V = bounds[-1]
    bad, tokens, counts = [], [], []
    for c in range(cases):
        dtype = (torch.float32, torch.bfloat16, torch.float16)[c % 3]
        x = random_case(g, V, dtype)
        mode = "coupled" if c % 4 == 3 else "exact"
        dense = c % 2 == 0 and mode == "exact"
        q = x["q"] if dense else None
        kw = dict(seed=x["seed"], offset=x["offset"], mode=mode, num_drafts=x["num_drafts"])
        if c % 5 == 4:  # filters over the whole vocabulary
            kw.update(top_k=30, top_p=0.9) if c % 2 else kw.update(min_p=0.05, top_p=0.8)
        ref_v = ref.verify(x["logits"], x["ids"], q, x["T"], **kw)
        with sd.count_bytes() as counter:
            got = verify(x["logits"][..., s:e], x["ids"], None if q is None else q[..., s:e], x["T"],
                            vocab_start=s, vocab_size=V, **kw)
        flags = tuple(kw.get(f) is not None for f in ("top_k", "top_p", "min_p"))
        counts.append((counter.calls, counter.bytes, tuple(x["logits"].shape), flags))
        for name in ("tokens", "num_accepted", "valid"):
            if not torch.equal(getattr(ref_v, name), getattr(got, name)):
                bad.append(f"case {c} ({dtype}, {mode}, dense={dense}): {name} {getattr(got, name).tolist()} != "
                           f"{getattr(ref_v, name).tolist()}")
        tokens.append(got.tokens)
        T = float(x["T"][0])
        fs = dict(top_k=20) if c % 3 == 1 else {}
        ref_s = ref.sample(x["logits"][:, 0], T, seed=7 + c, offset=c, **fs)
        got_s = sample(x["logits"][:, 0, s:e], T, vocab_start=s, vocab_size=V, seed=7 + c, offset=c, **fs)
        if not torch.equal(ref_s, got_s):
            bad.append(f"case {c} sample ({dtype}, T={T}): {got_s.tolist()} != {ref_s.tolist()}")
        tokens.append(got_s)
    return bad, tokens, counts


def rank_refusals(rank, world, group=None):
    """Calls where one rank's arguments are wrong or the ranks disagree: every rank must raise
    (and none hang). Returns (case, exception type, message) per case."""
    verify, sample = functools.partial(sd.verify, group=group), functools.partial(sd.sample, group=group)
    V = 512
    logits = torch.randn(2, 3, V, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[1, 2], [3, 4]])
    mid = 256
    s, e = (0, mid) if rank == 0 else (mid, V)
    ok = dict(vocab_start=s, vocab_size=V, seed=1)
    cases = {
        "overlap": lambda: verify(logits[..., s:e], ids, vocab_start=s - (10 if rank == 1 else 0), vocab_size=V,
                                 seed=1),
        "vocab_size": lambda: verify(logits[..., s:e], ids, vocab_start=s, vocab_size=V + rank, seed=1),
        "batch": lambda: verify(logits[: 2 - rank, :, s:e], ids[: 2 - rank], **ok),
        "drafts differ": lambda: verify(logits[..., s:e], ids + rank, **ok),
        "seed differs": lambda: verify(logits[..., s:e], ids, vocab_start=s, vocab_size=V, seed=rank),
        "bad temperature on rank 0": lambda: verify(logits[..., s:e], ids, temperature=-1.0 if rank == 0 else 1.0, **ok),
        "negative vocab_start": lambda: verify(logits[..., s:e], ids, vocab_start=-1 if rank == 1 else s,
                                                  vocab_size=V, seed=1),
        "shard past vocab_size": lambda: verify(logits[..., s:e], ids, vocab_start=s, vocab_size=300, seed=1),
        "filters differ": lambda: verify(logits[..., s:e], ids, top_k=5 + rank, **ok),
        "bad top_p": lambda: verify(logits[..., s:e], ids, top_p=1.5, **ok),
        "mixed ops": lambda: (verify(logits[..., s:e], ids, **ok) if rank == 0
                              else sample(logits[:, 0, s:e], vocab_start=s, vocab_size=V, seed=1)),
        "sample 3-d logits on rank 1": lambda: sample(logits[:, 0, s:e] if rank == 0 else logits[..., s:e],
                                                         vocab_start=s, vocab_size=V, seed=1),
    }
    out = []
    for name, call in cases.items():
        try:
            call()
            out.append((name, None, ""))
        except Exception as exc:  # noqa: BLE001
            out.append((name, type(exc).__name__, str(exc)))
    # the group still works after the refusals
    res = verify(logits[..., s:e], ids, **ok)
    out.append(("after", None, str(torch.equal(res.tokens, specdec_ext.verify(logits, ids, seed=1).tokens))))
    return out


def rank_subgroup(rank, world, group):
    """Global ranks 1 and 2 verify in their own ``group`` (group ranks 0 and 1); returns (tokens
    equal to one device's, the engine-style shared seed of the group)."""
    from specdec_ext.engine.phases import shared_seed

    V = 700
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 4, V, generator=g) * 3
    ids = logits[:, :3].argmax(-1)
    bounds = [0, 256, V]
    s, e = bounds[rank - 1], bounds[rank]
    got = sd.verify(logits[..., s:e], ids, None, 0.7, vocab_start=s, vocab_size=V, group=group, seed=3, top_k=40)
    ref = specdec_ext.verify(logits, ids, None, 0.7, seed=3, top_k=40)
    torch.manual_seed(100 + rank)  # the ranks' generators differ: the shared seed must not
    return torch.equal(got.tokens, ref.tokens), shared_seed(group)


def rank_simt_protocol(rank, world, bounds, cases, seed):
    """rank_identity with the protocol's steps on the SIMT emulation of the CUDA kernels (its
    op namespace swapped for torch.ops.specdec_simt: the gathers, checks and finish are the
    protocol's own), compared with the emulated single-device verify / sample; the header
    travels on an explicit host_group (a second gloo group of the same ranks)."""
    import torch.distributed as dist

    from specdec_ext.distributed import protocol
    from specdec_ext.testing import simt

    host = dist.new_group(list(range(world)), backend="gloo")
    protocol._OPS = simt._SimtOps()
    return rank_identity(rank, world, bounds, cases, seed, ref=simt, host_group=host)


def rank_suite(rank, world, layouts, cases, seed):
    """One spawn of 4 ranks, every gloo check: rank_identity for each layout of ``layouts``
    ({P: bounds}, P in 2..4) on the group of global ranks 0..P-1; rank_refusals on ranks 0, 1;
    rank_subgroup on ranks 1, 2 (a group whose first rank is not global rank 0). Returns
    {"identity": {P: ...}, "refusals": ..., "subgroup": ...} (None where this rank sits out)."""
    import torch.distributed as dist

    groups = {P: None if P == world else dist.new_group(list(range(P))) for P in layouts}
    pair = dist.new_group([1, 2])  # every rank creates every group, in the same order
    out = dict(identity={P: rank_identity(rank, P, bounds, cases, seed, groups[P]) if rank < P else None
                         for P, bounds in layouts.items()})
    out["refusals"] = rank_refusals(rank, 2, groups[2]) if rank < 2 else None
    out["subgroup"] = rank_subgroup(rank, world, pair) if rank in (1, 2) else None
    return out


def rank_nccl_no_sync(rank, world, V, bounds):
    """CUDA tensors over NCCL (one GPU per rank): sd.verify / sd.sample (filters, dense drafts)
    under torch.cuda.set_sync_debug_mode("error") after a warm-up call (the gloo side group is
    created then); returns whether the tokens equal the single-device CUDA ops'."""
    dev = torch.device("cuda", rank)
    g = torch.Generator().manual_seed(8)
    logits = (torch.randn(4, 4, V, generator=g) * 3).to(dev)
    q = torch.softmax(torch.randn(4, 3, V, generator=g), -1).to(dev)
    ids = torch.randint(0, V, (4, 3), generator=g).to(dev)
    s, e = bounds[rank], bounds[rank + 1]
    kw = dict(seed=torch.arange(4, device=dev) + 5, offset=2, top_p=0.9)

    def ours():
        return (sd.verify(logits[..., s:e], ids, q[..., s:e], 0.8, vocab_start=s, vocab_size=V, **kw),
                sd.sample(logits[:, 0, s:e], 0.8, vocab_start=s, vocab_size=V, seed=3, top_k=50))

    ours()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        res, tok = ours()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    ref = specdec_ext.verify(logits, ids, q, 0.8, **kw)
    ref_tok = specdec_ext.sample(logits[:, 0], 0.8, seed=3, top_k=50)
    return torch.equal(res.tokens, ref.tokens) and torch.equal(tok, ref_tok)
