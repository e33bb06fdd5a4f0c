"""Tiny SpecModels for engine tests: the next-token logits are a table lookup on the
previous token (a bigram model), batched over rows, with a per-row token history as
the "cache" (so rollback and cache-length bookkeeping are exercised exactly)."""
import torch

from specdec_ext.models.base import SpecModel


class BigramModel(SpecModel):
    """logits(next | prev) = table[prev]; the first token of a row sees table[start]."""

    def __init__(self, table: torch.Tensor, start: int = 0, device="cpu"):
        self.table = table.to(device)          # [V, V] float32 logits
        self.vocab_size = table.shape[0]
        self.device = torch.device(device)
        self.start = start
        self.calls = 0

    def reset(self, batch_size, max_len):
        self.max_len = max_len
        self.hist = torch.zeros(batch_size, max_len, dtype=torch.int64, device=self.device)
        self._len = torch.zeros(batch_size, dtype=torch.int64, device=self.device)

    def forward(self, input_ids):
        B, S = input_ids.shape
        self.calls += 1
        assert int((self._len + S).max()) <= self.max_len, "cache overflow"
        rows = torch.arange(B, device=self.device)
        out = []
        for s in range(S):
            self.hist[rows, self._len] = input_ids[:, s]
            self._len += 1
            out.append(self.table[input_ids[:, s]])
        return torch.stack(out, 1)

    def rollback(self, num_appended, num_kept):
        num_kept = torch.as_tensor(num_kept, device=self.device)
        assert bool(((num_kept >= 0) & (num_kept <= num_appended)).all())
        self._len -= num_appended - num_kept
        assert bool((self._len >= 0).all())

    @property
    def lengths(self):
        return self._len.clone()

    def history(self, b):
        return self.hist[b, : int(self._len[b])].tolist()


class ScriptedModel(BigramModel):
    """A draft whose table depends on the position in the sequence: phases = [(until, table)],
    so its acceptance rate changes over a generation (high, low, high, ...)."""

    def __init__(self, phases, device="cpu"):
        super().__init__(phases[-1][1], device=device)
        self.phases = [(until, t.to(device)) for until, t in phases]

    def forward(self, input_ids):
        B, S = input_ids.shape
        rows = torch.arange(B, device=self.device)
        out = []
        for s in range(S):
            pos = self._len.clone()
            self.hist[rows, self._len] = input_ids[:, s]
            self._len += 1
            logits = self.phases[-1][1][input_ids[:, s]]
            for until, table in reversed(self.phases):
                logits = torch.where((pos < until).view(B, 1), table[input_ids[:, s]], logits)
            out.append(logits)
        return torch.stack(out, 1)
