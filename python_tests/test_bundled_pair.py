"""The draft/target pair shipped with the package: files and checksums, both model
implementations agree, the engine's greedy output equals target-only decoding, the
tokenizer round-trips, and the CLI's main job runs offline."""
import os
import shutil

import pytest
import torch

from specdec_ext import SpeculativeEngine, bundled

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def push(self, x):",
           "    return {'a': 1, \"b\": [2, 3]}  # ünïcode"]


def test_files_present_and_checksums_match():
    sums = bundled.verify_checksums()
    for which in ("target", "draft"):
        for f in ("config.json", "model.safetensors", "tokenizer.json"):
            assert f"{which}/{f}" in sums
    total = sum(os.path.getsize(os.path.join(bundled.PAIR_DIR, rel)) for rel in sums)
    assert total < 16 * 2**20  # a few MB


def test_corrupt_or_missing_file_is_a_clear_error(tmp_path):
    root = tmp_path / "pair"
    shutil.copytree(bundled.PAIR_DIR, root)
    path = root / "draft" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(bundled.CorruptAssetError, match="draft/model.safetensors .* is corrupt"):
        bundled.verify_checksums(str(root))
    path.unlink()
    with pytest.raises(bundled.CorruptAssetError, match="draft/model.safetensors is missing"):
        bundled.verify_checksums(str(root))


def test_tokenizer_round_trips():
    tok = bundled.load_tokenizer()
    for p in PROMPTS:
        assert tok.decode(tok.encode(p).ids) == p
    assert tok.get_vocab_size() == 4096


def test_both_implementations_give_the_same_logits():
    """Reference model vs transformers.LlamaForCausalLM on the same fp16 weights, both
    computing in float32: max |difference| <= 1e-4 (logits are O(10))."""
    pytest.importorskip("transformers")
    ours = bundled.load_pair(dtype=torch.float32)
    hf = bundled.load_pair(dtype=torch.float32, implementation="hf", check=False)
    tok = bundled.load_tokenizer()
    ids = torch.tensor([tok.encode(PROMPTS[0] + "\n    return n").ids])
    for a, b in zip(ours, hf):
        la, lb = a(ids), b(ids).logits
        assert la.shape == lb.shape == (1, ids.shape[1], 4096)
        assert (la - lb).abs().max().item() <= 1e-4


def test_engine_greedy_equals_target_only_on_the_bundled_pair():
    target, draft = bundled.load_pair()
    tok = bundled.load_tokenizer()
    ids = [tok.encode(p).ids for p in PROMPTS[:3]]
    T = max(map(len, ids))
    batch = torch.zeros(3, T, dtype=torch.int64)
    mask = torch.zeros(3, T, dtype=torch.int64)
    for b, e in enumerate(ids):
        batch[b, T - len(e):], mask[b, T - len(e):] = torch.tensor(e), 1
    plain = SpeculativeEngine(target, draft, k=0, adaptive_k=False).generate(batch, 40, attention_mask=mask)
    for k, ad in [(4, False), (6, "cost")]:
        out = SpeculativeEngine(target, draft, k=k, adaptive_k=ad).generate(batch, 40, attention_mask=mask)
        assert out.generated == plain.generated
        assert sum(s.accepted for s in out.stats) > 0


def test_generate_cli_main_job_runs_offline(capsys, monkeypatch):
    from specdec_ext import generate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert generate.main(["--prompt", "def fibonacci(n):", "--max-new-tokens", "24", "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("def fibonacci(n):")
    assert "acceptance" in out[-1] and "tokens/s" in out[-1] and "speedup" in out[-1]


def test_generate_cli_with_checkpoint_dirs_ids_and_metrics(capsys):
    from specdec_ext import generate

    argv = ["--target", bundled.pair_dir("target"), "--draft", bundled.pair_dir("draft"), "--prompt-ids", "5", "6",
            "7", "--max-new-tokens", "12", "--k", "3", "--adaptive", "--metrics-port", "0", "--no-baseline",
            "--no-progress"]
    assert generate.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out[0].split()) == 12 and all(t.isdigit() for t in out[0].split())
    assert out[-1].startswith("acceptance")


@pytest.mark.parametrize("hf", [False, True], ids=["reference", "hf"])
def test_generate_cli_compiled_gives_the_eager_text(capsys, hf):
    """--compile: the reference pair on frozen compiled steps, and (--hf) the transformers
    pair on torch.compile'd batched forwards, print the same greedy text as the eager run:
    every printed line but the timing summary (the prompt is the first line; the generated
    code follows on the next ones)."""
    if hf:
        pytest.importorskip("transformers")
    from specdec_ext import generate

    argv = ["--prompt", "def fibonacci(n):", "--max-new-tokens", "16", "--drafter", "model",
            "--no-baseline", "--no-progress"] + (["--hf"] if hf else [])
    texts = []
    for extra in ([], ["--compile"]):
        assert generate.main(argv + extra) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[-1].startswith("acceptance")
        texts.append("\n".join(out[:-1]))
    assert texts[0].startswith("def fibonacci(n):") and len(texts[0]) > len("def fibonacci(n):\n")
    assert texts[0] == texts[1]
