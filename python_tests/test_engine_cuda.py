"""Engine on a GPU (skipped without one): no host sync inside a step apart from the one
device->host copy, and the same greedy output as on the CPU."""
import pytest
import torch

from specdec_ext import SpeculativeEngine
from specdec_ext.models import LlamaConfig, LlamaModel

pytestmark = pytest.mark.cuda


def _pair(device, dtype=torch.float32):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    target = LlamaModel(cfg, dtype=dtype, device="cpu")
    for p in target.parameters():
        torch.nn.init.normal_(p, std=0.05)
    draft = LlamaModel(cfg, dtype=dtype, device="cpu")
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    return target.to(device), draft.to(device)


def test_engine_step_has_no_hidden_sync_cuda():
    target, draft = _pair("cuda")
    eng = SpeculativeEngine(target, draft, k=4, adaptive_k=False)
    ids = torch.randint(0, 512, (4, 9), generator=torch.Generator().manual_seed(1))
    eng.generate(ids, 4, temperature=1.0, seed=1)  # warm up
    out = eng.generate(ids, 24, temperature=1.0, seed=2, debug_sync=True)
    assert all(len(g) == 24 for g in out.generated)


def test_engine_greedy_cuda_matches_cpu_cuda():
    ids = torch.randint(0, 512, (3, 7), generator=torch.Generator().manual_seed(2))
    outs = []
    for dev in ("cpu", "cuda"):
        target, draft = _pair(dev, torch.float64)  # float64 on both: no rounding-order ties
        outs.append(SpeculativeEngine(target, draft, k=3, adaptive_k=False).generate(ids, 20).sequences)
    assert torch.equal(outs[0], outs[1])
