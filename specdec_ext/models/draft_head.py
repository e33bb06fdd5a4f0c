"""A draft head: drafts from the target's own last hidden state, with no draft model.

    head = specdec_ext.bundled.load_head(target)               # the bundled pair's head
    engine = specdec_ext.SpeculativeEngine(target, None, drafter="head", draft_head=head)

After a target pass the engine knows, for each row, the final hidden state ``h`` (after the
final norm, the lm_head's input) at the position that produced the row's newest token
``x``. The head maps ``(h, x)`` to a feature that stands in for the target's next hidden
state, reads it out through the target's own final norm and lm_head, and repeats:

    f_0 = h,   f_(j+1) = f_j + W2 silu(W1 [f_j ; E(x_j)] + b1) + b2,   d_(j+1) = argmax lm_head(norm(f_(j+1)))

with ``x_0 = x`` and ``x_j = d_j`` (E: the target's token embedding). A draft costs two small
matmuls and one lm_head row instead of a draft model's forward, and needs no KV cache of its
own (Medusa, Cai et al. 2024, and EAGLE, Li et al. 2024, draft from the target's features
the same way; this head is EAGLE's feature recurrence without its attention layer). Drafts
are deterministic given the text, so verification sees one-hot q and the output law stays
exactly the target's at any temperature.

The bundled head (``assets/tiny_pair/head``) was trained by ``scripts/train_draft_head.py``
on the bundled target's features over its training corpus.
"""
from __future__ import annotations

import json
import os
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .cpu_linear import MAX_ROWS  # the most rows the skinny kernel takes; importing it registers the op

__all__ = ["DraftHead"]

_SKINNY = torch.ops.specdec.skinny_linear

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "head.safetensors"


class DraftHead(nn.Module):
    """The feature-recurrent draft head over a target LlamaModel (see the module docstring).

    Parameters
    ----------
    target : LlamaModel (reference implementation): the head reads its token embedding,
        final norm and lm_head (shared, not copied)
    intermediate_size : int, width of the head's hidden layer
    """

    def __init__(self, target, intermediate_size: int) -> None:
        super().__init__()
        from .llama import LlamaModel

        if not isinstance(target, LlamaModel):
            raise TypeError(f"target must be a specdec_ext LlamaModel, got {type(target).__name__}")
        hidden = target.config.hidden_size
        self.hidden_size, self.intermediate_size = hidden, int(intermediate_size)
        self.fc1 = nn.Linear(2 * hidden, self.intermediate_size, dtype=target.dtype, device=target.device)
        self.fc2 = nn.Linear(self.intermediate_size, hidden, dtype=target.dtype, device=target.device)
        object.__setattr__(self, "_target", target)  # not a submodule: its weights are the target's
        self.draft_vocab: Optional[torch.Tensor] = None  # [Vd] int64: the tokens it may draft (None: all)
        self._prep_key: Optional[list] = None  # what _prepared's tensors were built from

    @property
    def target(self):
        """The LlamaModel whose embedding, final norm and lm_head the head uses."""
        return self._target

    def step(self, feats: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """One recurrence step: feats [B, H] float, tokens [B] int64 -> the next feats [B, H]."""
        emb = F.embedding(tokens, self.target.model.embed_tokens.weight)
        return feats + self.fc2(F.silu(self.fc1(torch.cat([feats, emb], dim=-1))))

    def logits(self, feats: torch.Tensor) -> torch.Tensor:
        """feats [B, H] -> logits [B, V] through the target's final norm and lm_head."""
        from .cpu_linear import layer_linear
        from .llama import _rms_norm

        norm = self.target.model.norm
        return layer_linear(_rms_norm(feats, norm.weight, norm.eps), self.target.lm_head)

    def set_draft_vocab(self, token_ids: Optional[torch.Tensor]) -> None:
        """Draft only these tokens (Tensor [Vd] of distinct ids in [0, V), e.g. the corpus's most
        frequent; None: the whole vocabulary): each draft then reads Vd rows of the lm_head
        instead of V. A draft outside the set could only be a token the head rarely gets right."""
        if token_ids is not None:
            ids = torch.as_tensor(token_ids, dtype=torch.int64).flatten()
            if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.target.vocab_size:
                raise ValueError(f"token_ids must be a non-empty set of ids in [0, {self.target.vocab_size})")
            if ids.unique().numel() != ids.numel():
                raise ValueError("token_ids must be distinct")
            token_ids = ids.to(self.fc1.weight.device)
        self.draft_vocab = token_ids
        self._prep_key = None

    @property
    def draft_vocab_size(self) -> int:
        """How many tokens the head may draft: the size of :attr:`draft_vocab`, or V."""
        return self.target.vocab_size if self.draft_vocab is None else self.draft_vocab.numel()

    @torch.no_grad()
    def propose(self, feats: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
        """Greedy drafts: feats [B, H] (the target's final hidden state that produced
        ``tokens``), tokens [B] int64 -> Tensor [B, k] int64 (k >= 0), each the argmax of
        :meth:`logits` over :attr:`draft_vocab`.

        The same arithmetic as :meth:`step` and :meth:`logits`, arranged for a decode step:
        ``W1 [f ; E(x)] + b1`` is ``W1_f f + T[x]`` with the token half precomputed once per
        weight version as a table T [V, intermediate] (one row read instead of an embedding,
        a concatenation and half the matmul); both matmuls add their residual in the skinny
        kernel (:func:`~specdec_ext.models.cpu_linear.residual_linear`); and the final norm's
        1 / rms is left out, since a positive factor does not move the argmax (its weight is
        folded into a copy of the lm_head rows of the draft vocabulary)."""
        return self._drafts(feats, tokens, k, 1).squeeze(1)

    @torch.no_grad()
    def propose_branches(self, feats: torch.Tensor, tokens: torch.Tensor, k: int, branches: int) -> torch.Tensor:
        """Drafts that branch at the first token: feats [B, H], tokens [B] int64 (as in
        :meth:`propose`) -> Tensor [B, branches, k] int64 (k >= 1, 1 <= branches <= the draft
        vocabulary's size): branch j starts with the (j+1)-th most likely first draft and goes
        on greedily (branch 0 is :meth:`propose`'s chain, ties aside). The first tokens of the
        branches are distinct, so the branches form a tree of ``branches`` chains below the
        row's last token."""
        vocab = self.draft_vocab_size
        if not 1 <= branches <= vocab:
            raise ValueError(f"branches must be in [1, {vocab}], got {branches}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        return self._drafts(feats, tokens, k, branches)

    def _drafts(self, feats: torch.Tensor, tokens: torch.Tensor, k: int, branches: int) -> torch.Tensor:
        """:meth:`propose_branches` without its checks of k and branches: [B, branches, k]."""
        if feats.dim() != 2 or feats.shape[1] != self.hidden_size:
            raise ValueError(f"feats must be [B, {self.hidden_size}], got {tuple(feats.shape)}")
        if tokens.dim() != 1 or tokens.shape[0] != feats.shape[0]:
            raise ValueError(f"tokens must be [B] = [{feats.shape[0]}], got {tuple(tokens.shape)}")
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")

        from .cpu_linear import linear, residual_linear

        table, table_draft, w_feat, w_feat_packed, w2_packed, w_out, w_out_packed = self._prepared()
        B = feats.shape[0]
        if k == 0:
            return tokens.new_zeros((B, branches, 0))
        out = []
        # x: the first step's token is a vocabulary id; later ones are argmax positions in the
        # draft vocabulary, looked up in its rows of T and mapped to ids once at the end
        f, x, rows = feats.to(self.fc1.weight.dtype), tokens, table
        b2 = self.fc2.bias
        packed = w_feat_packed is not None and w2_packed is not None and w_out_packed is not None
        for j in range(k):
            if packed and f.shape[0] <= MAX_ROWS and not torch.compiler.is_compiling():
                # the packed kernel straight away: a draft costs 6 op calls, which dominate here
                a = _SKINNY(f, w_feat_packed, None, F.embedding(x, rows))  # [B, intermediate]
                f = _SKINNY(F.silu(a), w2_packed, b2, f)
                scores = _SKINNY(f, w_out_packed, None, None)  # [B, Vd]
            else:
                a = residual_linear(F.embedding(x, rows), f, w_feat, None, w_feat_packed)
                f = residual_linear(f, F.silu(a), self.fc2.weight, b2, w2_packed)
                scores = linear(f, w_out, None, w_out_packed)
            if j == 0 and branches > 1:  # each row's feature goes on once per branch
                x = scores.topk(branches, dim=-1).indices.flatten()  # [B * branches], row-major
                f = f.repeat_interleave(branches, dim=0)
            else:
                x = scores.argmax(-1)  # in the draft vocabulary
            out.append(x)
            rows = table_draft
        if branches > 1:
            out[0] = out[0].view(B, branches)
            drafts = torch.cat([out[0].unsqueeze(-1)] + [x.view(B, branches, 1) for x in out[1:]], dim=-1)
        else:
            drafts = torch.stack(out, dim=1).unsqueeze(1)  # [B, 1, k]
        return drafts if self.draft_vocab is None else self.draft_vocab[drafts]

    def _prepared(self):
        """(T [V, intermediate], T's rows of the draft vocabulary [Vd, intermediate],
        W1_f [intermediate, H], its packed copy or None, fc2's packed copy or None, the draft
        vocabulary's lm_head rows times the final norm's weight [Vd, H], its packed copy or
        None), rebuilt when a weight they derive from changes (version or storage) or the draft
        vocabulary does."""
        from ..ops.linear import pack_linear_weight
        from .cpu_linear import _packable, _version

        model = self.target.model
        sources = (model.embed_tokens.weight, self.target.lm_head.weight, model.norm.weight,
                   self.fc1.weight, self.fc1.bias, self.fc2.weight)
        key = [(t.data_ptr(), _version(t)) for t in sources]
        key.append(id(self.draft_vocab))
        if self._prep_key != key:
            emb, head, norm, w1, b1, w2 = sources
            H = self.hidden_size
            table = F.linear(emb, w1[:, H:], b1)  # [V, intermediate]
            w_feat = w1[:, :H].contiguous()
            vocab = self.draft_vocab
            rows = head if vocab is None else head[vocab]
            w_out = (rows * norm).contiguous()  # [Vd, H]

            def pack(w):
                return pack_linear_weight(w) if _packable(w) else None
            self._prep = (table, table if vocab is None else table[vocab].contiguous(),
                          w_feat, pack(w_feat), pack(w2.detach()), w_out, pack(w_out))
            self._prep_key = key
        return self._prep

    # ---- files ------------------------------------------------------------------------
    def save_pretrained(self, path: str, meta: Optional[dict] = None) -> None:
        """Write ``config.json`` and ``head.safetensors`` (fp16) under ``path``."""
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, CONFIG_NAME), "w") as f:
            json.dump({"hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                       "vocab_size": self.target.vocab_size, **(meta or {})}, f, indent=1, sort_keys=True)
        tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in self.state_dict().items()}
        if self.draft_vocab is not None:
            tensors["draft_vocab"] = self.draft_vocab.cpu().contiguous()
        save_file(tensors, os.path.join(path, WEIGHTS_NAME))

    @classmethod
    def from_pretrained(cls, path: str, target) -> "DraftHead":
        """The head saved under ``path`` (:meth:`save_pretrained`) over ``target``; raises
        ValueError when it was made for another hidden size or vocabulary."""
        from safetensors.torch import load_file

        with open(os.path.join(path, CONFIG_NAME)) as f:
            cfg = json.load(f)
        if cfg["hidden_size"] != target.config.hidden_size or cfg["vocab_size"] != target.vocab_size:
            raise ValueError(f"the head under {path} is for hidden_size {cfg['hidden_size']} and vocabulary "
                             f"{cfg['vocab_size']}, the target has {target.config.hidden_size} and {target.vocab_size}")
        head = cls(target, cfg["intermediate_size"])
        state = load_file(os.path.join(path, WEIGHTS_NAME))
        vocab = state.pop("draft_vocab", None)
        head.load_state_dict({k: v.to(target.dtype) for k, v in state.items()})
        head.set_draft_vocab(vocab)
        return head.eval()
