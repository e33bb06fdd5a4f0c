"""specdec_ext.distributed under faults and disagreements (gloo on CPU, spawned ranks).

- Fail fast: a rank killed (os._exit) or stalled in the middle of a call, of 2 and of 3 ranks:
  every other rank raises CollectiveError naming the call, within a generous bound of the
  call's short ``timeout`` (far below the process group's own timeout, which a wait without
  the call's timeout would run into).
- One group of 3 ranks: ``seed=None`` over ranks whose torch generators differ gives the same
  tokens on every rank, equal to the single-device op with the seed the group's first rank
  draws (the world, and a subgroup whose first rank is global rank 1); shards that stop short
  of ``vocab_size`` or leave a hole, ranks calling different operations, and a bad ``timeout``
  on one rank are refused on every rank, and the group still works afterwards.

The rank functions live here (module level, so the spawned ranks can unpickle them).
"""
import os
import time

import pytest
import torch

import specdec_ext
from specdec_ext import distributed as sd
from specdec_ext.distributed import CollectiveError, even_bounds
from specdec_ext.distributed._comm import check_timeout
from specdec_ext.distributed.launch import run_ranks
from specdec_ext.ops._args import seed_arg

V = 1000
FAST = 1.5  # the fault tests' call timeout (s)
PG_TIMEOUT = 30  # the process group's own timeout (s): what a wait without the call's timeout hits
BOUND = 10 * FAST  # each surviving rank must have raised within this (generous: 2 shared cores)


def _inputs(seed=0, B=8, K=3):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, K + 1, V, generator=g) * 2
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1)
    ids = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(B, K)
    return logits, ids, q


def _small():
    """[2, 3, 512] logits (the same on every rank) and [2, 2] draft ids."""
    return torch.randn(2, 3, 512, generator=torch.Generator().manual_seed(9)), torch.tensor([[1, 2], [3, 4]])


class _Stalled(Exception):
    """Raised by the stalled rank when it gives up waiting, to leave the call."""


def rank_fault(rank, world, victim, action, at, op, marker_dir):
    """A healthy warm-up call, then a call (``op``: "verify" | "sample", timeout FAST) in which
    rank ``victim`` dies (action "kill": os._exit) or stalls (action "stall": it waits until
    every other rank has left the call, at most 60 s, then leaves it) at its ``at``-th
    all-gather (1 = the header, 2 = step 1, ...). Returns (outcome, message, seconds in the
    call): outcome the exception's type name, "returned", or "stalled" (the victim; its
    message then says how many other ranks had left the call when it stopped waiting)."""
    from specdec_ext.distributed import protocol

    logits, ids, q = _inputs()
    bounds = even_bounds(V, world)
    s, e = bounds[rank], bounds[rank + 1]

    def call(timeout):
        if op == "verify":
            return sd.verify(logits[..., s:e], ids, q[..., s:e], 0.8, vocab_start=s, vocab_size=V, seed=3,
                             top_k=50, timeout=timeout)
        return sd.sample(logits[:, 0, s:e], 0.8, vocab_start=s, vocab_size=V, seed=3, top_p=0.9, timeout=timeout)

    call(60.0)  # every rank has run the ops and used the connections: nothing slow is left for the timed call
    real, count = protocol.all_gather, [0]

    def gather(*args, **kwargs):
        count[0] += 1
        if rank == victim and count[0] == at:
            if action == "kill":
                os._exit(17)
            deadline = time.monotonic() + 60
            while len(os.listdir(marker_dir)) < world - 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            raise _Stalled(f"{len(os.listdir(marker_dir))} of {world - 1} ranks had left the call")
        return real(*args, **kwargs)

    protocol.all_gather = gather
    t0 = time.monotonic()
    try:
        call(FAST)
        outcome, message = "returned", ""
    except _Stalled as exc:
        return "stalled", str(exc), time.monotonic() - t0
    except Exception as exc:  # noqa: BLE001  (the parent judges it)
        outcome, message = type(exc).__name__, str(exc)
    elapsed = time.monotonic() - t0
    open(os.path.join(marker_dir, str(rank)), "w").close()
    return outcome, message, elapsed


@pytest.mark.parametrize("world, action, at, op", [
    (2, "kill", 3, "verify"), (3, "kill", 2, "sample"), (2, "stall", 2, "sample"), (3, "stall", 3, "verify")],
    ids=["kill 1 of 2", "kill 1 of 3", "stall 1 of 2", "stall 1 of 3"])
def test_a_dead_or_stalled_rank_fails_every_other_rank_fast(tmp_path, world, action, at, op):
    """The last rank dies or stalls at a step gather of the call: every other rank raises
    CollectiveError (naming the call, the failed all-gather and the timeout) within BOUND, far
    below the process group's PG_TIMEOUT; the stalled rank was still stalled then."""
    victim = world - 1
    out = run_ranks(rank_fault, world, victim, action, at, op, str(tmp_path), timeout_s=PG_TIMEOUT,
                    allow_exit=True)
    if action == "kill":
        assert out[victim] is None, out[victim]
    else:
        assert out[victim][:2] == ("stalled", f"{world - 1} of {world - 1} ranks had left the call"), out[victim]
    for r in range(victim):
        outcome, message, elapsed = out[r]
        assert outcome == "CollectiveError", (r, outcome, message)
        assert f"specdec_ext.distributed.{op}: the " in message and "all-gather" in message, message
        assert f"rank {r} of {world} (timeout = {FAST:g} s)" in message and "died, stalled" in message, message
        assert elapsed < BOUND, f"rank {r} raised after {elapsed:.1f} s (timeout {FAST} s): {message}"


def rank_agreement(rank, world):
    """seed=None, refused layouts and calls, and a healthy call after them, on 3 ranks (and the
    subgroup of global ranks 1, 2; and the pair 0, 1). Returns a dict of this rank's results:
    "seed" {group: (tokens, the seed this rank would draw first, or None)}, "refusals"
    {case: (exception type, message)}, "after" (tokens of a healthy call)."""
    import torch.distributed as dist

    tail = dist.new_group([1, 2])  # every rank creates every group, in the same order
    pair = dist.new_group([0, 1])
    logits, ids, q = _inputs(seed=5, B=16)
    out = {"seed": {}, "refusals": {}}
    torch.manual_seed(1000 + rank)  # the ranks' generators differ
    for name, group, members in (("world", None, [0, 1, 2]), ("tail", tail, [1, 2])):
        if rank not in members:
            continue
        bounds = even_bounds(V, len(members))
        i = members.index(rank)
        s, e = bounds[i], bounds[i + 1]
        peek = None
        if i == 0:  # the seed the call will draw on this rank: its generator's next seed_arg(None)
            state = torch.get_rng_state()
            peek = int(seed_arg(None))
            torch.set_rng_state(state)
        res = sd.verify(logits[..., s:e], ids, q[..., s:e], 1.0, vocab_start=s, vocab_size=V, group=group)
        if i == 0:
            state = torch.get_rng_state()
            peek_sample = int(seed_arg(None))
            torch.set_rng_state(state)
        else:
            peek_sample = None
        tok = sd.sample(logits[:, 0, s:e], 1.0, vocab_start=s, vocab_size=V, group=group)
        out["seed"][name] = (res.tokens, res.num_accepted, peek, tok, peek_sample)

    def refusal(name, call):
        try:
            call()
            out["refusals"][name] = (None, "")
        except Exception as exc:  # noqa: BLE001
            out["refusals"][name] = (type(exc).__name__, str(exc))

    W = 512
    x, d = _small()
    layouts = {"short [0, 400) of 512": [(0, 128), (128, 256), (256, 400)],
               "hole [128, 256)": [(0, 128), (256, 384), (384, 512)],
               "overlap": [(0, 256), (128, 384), (384, 512)]}
    for name, shards in layouts.items():
        s, e = shards[rank]
        refusal(name, lambda: sd.verify(x[..., s:e], d, vocab_start=s, vocab_size=W, seed=1))
    if rank < 2:  # 2 ranks whose shards cover [0, 400) of 512
        s, e = ((0, 256), (256, 400))[rank]
        refusal("pair short", lambda: sd.verify(x[..., s:e], d, vocab_start=s, vocab_size=W, seed=1, group=pair))
    bounds = even_bounds(W, world)
    s, e = bounds[rank], bounds[rank + 1]
    refusal("mixed ops", lambda: (sd.sample(x[:, 0, s:e], vocab_start=s, vocab_size=W, seed=1) if rank == 1 else
                                  sd.verify(x[..., s:e], d, vocab_start=s, vocab_size=W, seed=1)))
    refusal("bad timeout on rank 2", lambda: sd.verify(x[..., s:e], d, vocab_start=s, vocab_size=W, seed=1,
                                                       timeout=0 if rank == 2 else 60))
    out["after"] = sd.verify(x[..., s:e], d, vocab_start=s, vocab_size=W, seed=1).tokens
    return out


@pytest.fixture(scope="module")
def agreement():
    return run_ranks(rank_agreement, 3, timeout_s=60)


@pytest.mark.parametrize("group, members", [("world", [0, 1, 2]), ("tail", [1, 2])])
def test_seed_none_is_the_first_ranks(agreement, group, members):
    """seed=None with different torch generators on the ranks: every rank returns the tokens
    of the single-device verify / sample with the seed the group's first rank drew."""
    logits, ids, q = _inputs(seed=5, B=16)
    results = [agreement[r]["seed"][group] for r in members]
    _, _, seed, _, seed_sample = results[0]
    ref = specdec_ext.verify(logits, ids, q, 1.0, seed=seed)
    ref_tok = specdec_ext.sample(logits[:, 0], 1.0, seed=seed_sample)
    for r, (tokens, accepted, _, tok, _) in zip(members, results):
        assert torch.equal(tokens, ref.tokens) and torch.equal(accepted, ref.num_accepted), (group, r)
        assert torch.equal(tok, ref_tok), (group, r, tok.tolist(), ref_tok.tolist())
    # the seed matters here: another seed gives other tokens (so equal tokens are no accident)
    assert not torch.equal(specdec_ext.verify(logits, ids, q, 1.0, seed=seed + 1).tokens, ref.tokens)


def test_layouts_and_calls_refused_on_every_rank(agreement):
    """Shards short of vocab_size (3 ranks; 2 ranks covering [0, 400) of 512), with a hole, or
    overlapping; one rank calling sample while the others call verify; a bad timeout on one
    rank: a ValueError on every rank of the call, naming the rule (the refusing rank's own
    message, a message naming it on the others); then a healthy call works."""
    tiles = "the shards must tile [0, vocab_size = 512)"
    for r in range(3):
        got = agreement[r]["refusals"]
        for name in ("short [0, 400) of 512", "hole [128, 256)", "overlap") + (("pair short",) if r < 2 else ()):
            assert got[name][0] == "ValueError" and tiles in got[name][1], (r, name, got[name])
        kind, msg = got["mixed ops"]
        assert kind == "ValueError" and "different ops (rank order): ['verify', 'sample', 'verify']" in msg, (r, msg)
        kind, msg = got["bad timeout on rank 2"]
        want = "timeout must be a number of seconds" if r == 2 else "rank(s) [2] refused"
        assert kind == "ValueError" and want in msg, (r, msg)
    assert "[0, 128), rank 1: [128, 256), rank 2: [256, 400)" in agreement[0]["refusals"]["short [0, 400) of 512"][1]
    ref = specdec_ext.verify(*_small(), seed=1)
    assert all(torch.equal(agreement[r]["after"], ref.tokens) for r in range(3))


@pytest.mark.parametrize("value, error", [(0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
                                          (float("inf"), ValueError), (1e8, ValueError), (True, TypeError),
                                          ("5", TypeError), (torch.tensor(5.0), TypeError)])
def test_timeout_rule(value, error):
    with pytest.raises(error, match="timeout must be a number of seconds"):
        check_timeout(value)
    assert check_timeout(2) == 2.0 and check_timeout(0.25) == 0.25
