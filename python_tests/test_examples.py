"""examples/hf_custom_loop.py, the README's drop-in loop on Hugging Face models: greedy
output equals target.generate token for token (with rejections, so the DynamicCache
rollback is exercised), its sampled output equals SpeculativeEngine's with the same seed
(the same RNG offsets), and the script runs from the command line."""
import importlib.util
import os
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import cli_runner  # noqa: E402
from specdec_ext import SpeculativeEngine, bundled  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "hf_custom_loop.py")


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("hf_custom_loop", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def pair64():
    """The bundled pair through transformers, in float64: the loop scores K + 1 tokens per
    forward where generate scores one, and float64 keeps those sums from flipping a near-tie."""
    return bundled.load_pair(implementation="hf", dtype=torch.float64, check=False)


# Both paths of the rollback: rejected drafts cropped from both caches ("def"), and every
# draft accepted, so the draft's cache lags by d_K, fed at the next step ("import").
@pytest.mark.parametrize("prompt,k,all_accepted", [("def fibonacci(n):", 4, False), ("import os\n", 2, True)])
def test_greedy_equals_hf_generate(example, pair64, prompt, k, all_accepted):
    target, draft = pair64
    ids = bundled.load_tokenizer().encode(prompt).ids
    new, stats = example.speculative_generate(target, draft, ids, 24, k=k)
    ref = target.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, pad_token_id=0,
                          eos_token_id=None)[0, len(ids):].tolist()
    assert new == ref
    assert stats.accepted > 0 and (stats.accepted == stats.drafted) == all_accepted, stats


def test_budget_and_single_token_prompt(example, pair64):
    """A one-token prompt (no prefill) and a budget smaller than k + 1 (K clipped, K = 0 steps)."""
    target, draft = pair64
    new, _ = example.speculative_generate(target, draft, [5], 3, k=6)
    ref = target.generate(torch.tensor([[5]]), max_new_tokens=3, do_sample=False, pad_token_id=0,
                          eos_token_id=None)[0, 1:].tolist()
    assert new == ref


def test_sampled_text_equals_the_engine_with_the_same_seed(example):
    """At T = 1 the loop's offsets are the engine's (specdec_ext/engine/rng_keys.py): same seed,
    same fixed K, same rule (the loop verifies token by token), same tokens."""
    target, draft = bundled.load_pair(implementation="hf", check=False)
    ids = bundled.load_tokenizer().encode("def fibonacci(n):").ids
    new, _ = example.speculative_generate(target, draft, ids, 24, k=4, temperature=1.0, seed=5)
    out = SpeculativeEngine(target, draft, k=4, adaptive_k=False, verify_mode="exact").generate(
        torch.tensor([ids]), 24, temperature=1.0, seed=5)
    assert new == out.generated[0]
    assert new != example.speculative_generate(target, draft, ids, 24, k=4, temperature=1.0, seed=6)[0]


def test_eos_stops_the_loop(example, pair64):
    target, draft = pair64
    ids = bundled.load_tokenizer().encode("def fibonacci(n):").ids
    free, _ = example.speculative_generate(target, draft, ids, 12, k=3)
    new, _ = example.speculative_generate(target, draft, ids, 12, k=3, eos_token_id=free[4])
    assert new == free[: free.index(free[4]) + 1]


def test_script_runs_and_checks_itself():
    r = cli_runner.run([SCRIPT, "--check", "--max-new-tokens", "16"], timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("def fibonacci(n):")
    assert "check: equal to target.generate (greedy), 16 tokens" in r.stdout


def test_script_refuses_check_when_sampling():
    r = cli_runner.run([SCRIPT, "--check", "--temperature", "1"], timeout=120)
    assert r.returncode == 2 and "--check compares with greedy generate" in r.stderr
