"""Shared helpers of the test suite (import as ``from helpers import ...``; the pytest
fixtures themselves live in conftest.py)."""
import os

import pytest
import torch

import specdec_ext

#: a GPU and a build with the CUDA kernels: tests marked ``cuda`` run only then
CUDA = torch.cuda.is_available() and specdec_ext.has_cuda_kernels()

#: ``SPECDEC_QUICK=1`` (``bash scripts/test.sh --quick``, the edit-test loop): every test
#: runs, the long statistical and fuzz runs with the reduced counts of draws()
QUICK = os.environ.get("SPECDEC_QUICK", "0") == "1"


def draws(full, quick=None):
    """The size of a long run (the draws of a chi-square test, the tokens of a long CLI
    generation): ``full`` in the full suite (what CI runs), ``quick`` (default ``full // 10``)
    under SPECDEC_QUICK=1. Seeds are fixed, so check that the test passes at both sizes; a
    chi-square test keeps ALPHA and its merging of cells with expected count < 5 at either,
    and a power check (p < ALPHA) must still reject at the quick size (else pass a larger
    ``quick``)."""
    if not QUICK:
        return full
    return full // 10 if quick is None else quick

#: the devices an op test runs on (the CUDA one is marked ``cuda``)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def capture_graph(step):
    """A CUDA graph of ``step()``, captured after one warm-up run on a side stream (allocator,
    lazy initialisation): replay() runs the step again on whatever its tensors hold."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def draft_inputs(B, K, V, dtype, seed):
    """Random verify inputs: logits [B, K+1, V] (N(0, 4), as ``dtype``), draft probabilities
    [B, K, V] near the target's softmax, and draft ids [B, K] drawn from them; CPU tensors."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, K + 1, V, generator=g) * 2).to(dtype)
    q = torch.softmax(logits[:, :K].float() + 0.5 * torch.randn(B, K, V, generator=g), -1).to(dtype)
    ids = torch.multinomial(q.float().view(-1, V), 1, generator=g).view(B, K)
    return logits, ids, q


def ragged_prompts(vocab=97, seed=3):
    """ids [3, 7] int64 with left padding (0) and attention_mask [3, 7]: prompts of 7, 5, 2 tokens."""
    torch.manual_seed(seed)
    ids = torch.randint(1, vocab, (3, 7))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :5] = 0
    ids[mask == 0] = 0
    return ids, mask


def tiny_llama(hidden, layers, seed, vocab=97):
    """A random Hugging Face LlamaForCausalLM in float64 (eval mode), seeded."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                   num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256)
    return transformers.LlamaForCausalLM(cfg).double().eval()


def near_copy(model, noise=1e-3, seed=0):
    """A deep copy of ``model`` with N(0, noise^2) added to every parameter (a close draft);
    seed None draws from torch's generator as it stands."""
    import copy

    if seed is not None:
        torch.manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn_like(p) * noise)
    return out


def assert_cache_matches_prefill(wrapper, full_model, seqs, pending_ok):
    """After a generation, ``wrapper``'s cache (any SpecModel with ``lengths``) holds exactly
    a prefix of each row's sequence ``seqs[b]`` (prompt + generated), leaving a number of
    pending tokens in ``pending_ok``: feeding them (two columns per forward, so a full row
    never overflows) gives the logits a fresh forward of ``full_model`` (a transformers
    causal LM) over the whole sequence gives."""
    from specdec_ext.engine.phases import catch_up

    lengths = wrapper.lengths.tolist()
    pending = [s[n:] for s, n in zip(seqs, lengths)]
    assert all(len(p) in pending_ok for p in pending), [len(p) for p in pending]
    logits = catch_up(wrapper, pending, 2, lambda t: t)   # [B, V] at each row's last token
    for b, s in enumerate(seqs):
        fresh = full_model(torch.tensor([s])).logits[0, -1]
        torch.testing.assert_close(logits[b], fresh, rtol=1e-9, atol=1e-9)


def hf_fresh_prefill(model, seq):
    """Per layer (keys, values) [1, H, len(seq), D] of a fresh transformers DynamicCache
    prefill of the token list ``seq`` by the causal LM ``model``."""
    import inspect

    import transformers

    fresh = transformers.DynamicCache()
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        model(torch.tensor([seq]), use_cache=True, **{kw: fresh})
    if hasattr(fresh, "layers"):
        return [(layer.keys, layer.values) for layer in fresh.layers]
    return list(zip(fresh.key_cache, fresh.value_cache))


def reference_model(hf, cache="contiguous"):
    """The package's reference Llama (float64) with ``hf``'s weights, wrapped as a SpecModel
    with a contiguous or a paged (blocks of 4) cache."""
    from specdec_ext.models import LlamaModel, LlamaSpecModel

    m = LlamaModel.from_state_dict(hf.config, hf.state_dict(), dtype=torch.float64)
    return LlamaSpecModel(m, cache=cache, block_size=4) if cache == "paged" else LlamaSpecModel(m)


class CountingOps:
    """Stands in for torch.ops.specdec in the wrappers (monkeypatch specdec_ext.ops.sampling._OPS):
    counts each op called through it (``calls``: name -> count); ``_real`` is the namespace wrapped."""

    def __init__(self, real):
        self._real, self.calls = real, {}

    def __getattr__(self, name):
        op = getattr(self._real, name)

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return op(*args, **kwargs)
        return counted


def run_generate(capsys, *argv):
    """(exit code, stdout, stderr) of ``specdec_ext.generate.main(argv)`` in this process."""
    from specdec_ext import generate

    try:
        rc = generate.main(list(argv))
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err
