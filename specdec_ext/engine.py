"""The speculative decoding engine: draft -> verify -> rollback, batched, adaptive K.

One step (B rows, K drafts):

1. Draft: the draft model first catches up on its pending committed tokens (usually the
   last correction token c; [d_K, c] after a fully accepted step; more after K = 0
   steps), then K-1 more single-token forwards. Each draft token comes from
   :func:`specdec_ext.sample` writing ``draft_probs[:, i]`` in place: no host sync.
2. Target: one forward over [last committed token, d_1..d_K] (K+1 tokens per row).
3. :func:`specdec_ext.verify` -> per-row accepted count n and correction/bonus token c.
4. ONE device->host copy per step: the step's tokens and counts. The host decides what
   each row emits (stopping at EOS / max_new_tokens), then both caches roll back on the
   device: the target keeps [last, d_1..d_(m-1)] for m emitted tokens (c has no KV yet
   and is fed next step); the draft keeps everything it processed that is now committed.
   The draft never processed d_K, so a fully accepted step leaves it two pending tokens.

Both caches are prefilled with the prompt minus its last token, which is the first
pending token of both models. Rows have their own lengths, so ragged prompts and
different acceptance counts need no padding inside the caches. Rows stop independently
and never emit a token past EOS or max_new_tokens; a finished row keeps running in the
batch (its results are ignored and its caches are not advanced).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

import torch

from .adaptive_k import AcceptanceEstimator, StepCosts, make_policy
from .metrics import SpecDecMetrics
from .models.base import SpecModel
from .sampling import sample, verify


@dataclass
class RowStats:
    """Per-row statistics of one :meth:`SpeculativeEngine.generate` call."""

    tokens_generated: int = 0
    steps: int = 0          # target steps in which the row was active
    drafted: int = 0        # draft tokens proposed to this row
    accepted: int = 0       # of those, accepted by verify
    rejections: int = 0     # steps that ended with a rejected draft (n < K)
    ks: List[int] = field(default_factory=list, repr=False)       # K of each step
    emitted: List[int] = field(default_factory=list, repr=False)  # tokens emitted at each step

    @property
    def acceptance_rate(self) -> float:
        """Fraction of drafted tokens accepted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def alpha(self) -> float:
        """Per-token acceptance probability (Leviathan's alpha), estimated from tested
        drafts: accepted / (accepted + rejections); drafts after a rejection are untested."""
        tested = self.accepted + self.rejections
        return self.accepted / tested if tested else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens_generated / self.steps if self.steps else 0.0


@dataclass
class GenerationOutput:
    """``sequences`` [B, T + G] int64 (CPU): the prompt as given, then each row's generated
    ids, padded with ``pad_token_id`` after a row stops (like ``transformers`` generate).
    ``generated``: each row's new ids as a list. ``stats``: a :class:`RowStats` per row."""

    sequences: torch.Tensor
    generated: List[List[int]]
    stats: List[RowStats]
    elapsed_s: float = 0.0
    phase_s: dict = field(default_factory=dict)  # total seconds: draft, target, verify; steps, draft_steps


def as_spec_model(model) -> SpecModel:
    """A SpecModel as is; a Hugging Face PreTrainedModel wrapped by HFSpecModel; a
    :class:`specdec_ext.models.llama.LlamaModel` wrapped by LlamaSpecModel."""
    if isinstance(model, SpecModel):
        return model
    try:
        from .models.llama import LlamaModel, LlamaSpecModel
        if isinstance(model, LlamaModel):
            return LlamaSpecModel(model)
    except ImportError:
        pass
    if hasattr(model, "config") and hasattr(model, "generate"):
        from .models.hf import HFSpecModel
        return HFSpecModel(model)
    raise TypeError(f"target/draft must be a SpecModel, a specdec_ext LlamaModel or a transformers "
                    f"PreTrainedModel, got {type(model).__name__}")


class SpeculativeEngine:
    """Speculative decoding with a target and a draft model.

    Parameters
    ----------
    target, draft : SpecModel | transformers.PreTrainedModel | specdec_ext LlamaModel
        Same vocabulary, same device.
    k : int >= 0
        Drafts per step (the maximum when adaptive). 0 = plain decoding with the target.
    adaptive_k : bool | str
        False/'fixed': always k. True/'cost': per-request acceptance estimates and measured
        step costs choose K in [0, k] to maximise expected tokens per second.
        'threshold': alpha below 40% -> K = 2, back to k when it recovers.
    metrics : SpecDecMetrics, optional
        Prometheus metrics to update each step.
    pad_token_id : int, optional
        Fills ``sequences`` after a row stops (default: the smallest eos id, else 0).
    step_costs : StepCosts, optional
        The cost model adaptive K starts from (default: measured online from scratch);
        ``StepCosts(draft_guess=c, target_guess=1, frozen=True)`` fixes a known ratio c.
    """

    def __init__(self, target, draft, k: int = 5, adaptive_k: Union[bool, str] = True,
                 metrics: Optional[SpecDecMetrics] = None, pad_token_id: Optional[int] = None,
                 step_costs: Optional[StepCosts] = None):
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ValueError(f"k must be an int >= 0, got {k!r}")
        self.target, self.draft = as_spec_model(target), as_spec_model(draft)
        if self.target.vocab_size != self.draft.vocab_size:
            raise ValueError(f"draft vocabulary ({self.draft.vocab_size}) differs from the target's "
                             f"({self.target.vocab_size}): speculative decoding needs one vocabulary")
        if torch.device(self.target.device) != torch.device(self.draft.device):
            raise ValueError(f"target is on {self.target.device} but draft is on {self.draft.device}: "
                             "put both models on one device")
        self.device = torch.device(self.target.device)
        self.k_max = k
        kind = {True: "cost", False: "fixed"}.get(adaptive_k, adaptive_k)
        self.policy_kind = kind
        make_policy(kind, k)  # validates
        self.metrics = metrics
        self.pad_token_id = pad_token_id
        self.step_costs = step_costs

    # ------------------------------------------------------------------ helpers
    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Host -> device without a host sync (pinned + non_blocking on CUDA)."""
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    def _timer(self):
        return _CudaTimer() if self.device.type == "cuda" else _HostTimer()

    @staticmethod
    def _prefill(model: SpecModel, prompts: List[List[int]], device_put) -> None:
        """Feed each prompt minus its last token (right-padded, pads rolled back)."""
        lens = [len(p) - 1 for p in prompts]
        width = max(lens)
        if width == 0:
            return
        ids = torch.zeros(len(prompts), width, dtype=torch.int64)
        for b, p in enumerate(prompts):
            ids[b, :lens[b]] = torch.tensor(p[:-1], dtype=torch.int64)
        model.forward(device_put(ids))
        model.rollback(width, torch.tensor(lens, dtype=torch.int64))

    # ------------------------------------------------------------------ generate
    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: Union[float, torch.Tensor] = 0.0,
                 seed: Optional[int] = None, eos_token_id: Union[int, Sequence[int], None] = None,
                 attention_mask: Optional[torch.Tensor] = None, debug_sync: bool = False,
                 progress=None) -> GenerationOutput:
        """Generate up to ``max_new_tokens`` tokens per row.

        input_ids      : Tensor [B, T] int64 (a [T] tensor is one row). Padded rows need
                         ``attention_mask`` [B, T] (1 = token, 0 = padding; left or right).
        temperature    : float >= 0 or Tensor [B]; 0 = greedy.
        seed           : int for a reproducible run (None: drawn from torch's generator).
        eos_token_id   : int or ints; a row stops after emitting one (it is emitted).
        debug_sync     : CUDA only: run every phase under torch.cuda.set_sync_debug_mode
                         ("error") (the one per-step device->host copy excepted).
        progress       : optional callable(tokens_done: int) called after each step.
        Returns a :class:`GenerationOutput`.
        """
        t_start = time.perf_counter()
        input_ids, prompts = self._check_inputs(input_ids, attention_mask)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        B = len(prompts)
        temps = self._check_temperature(temperature, B)
        eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
        pad = self.pad_token_id if self.pad_token_id is not None else (min(eos) if eos else 0)
        stats = [RowStats() for _ in range(B)]
        generated: List[List[int]] = [[] for _ in range(B)]
        if max_new_tokens == 0:
            return self._output(input_ids, generated, stats, pad, t_start)

        k_max = self.k_max
        max_len = max(len(p) for p in prompts) + max_new_tokens + k_max + 2
        for name, m in (("target", self.target), ("draft", self.draft)):
            cap = getattr(m, "max_positions", None)
            if cap is not None and max_len > cap:
                raise ValueError(f"prompt ({max(len(p) for p in prompts)} tokens) + max_new_tokens "
                                 f"({max_new_tokens}) + k + 2 = {max_len} exceeds the {name} model's capacity "
                                 f"of {cap} positions")
        self.target.reset(B, max_len)
        self.draft.reset(B, max_len)
        self._prefill(self.target, prompts, self._to_device)
        self._prefill(self.draft, prompts, self._to_device)

        dev = self.device
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())  # CPU generator: no device sync
        temps_dev = self._to_device(temps)
        greedy_all = bool((temps == 0).all())
        last_dev = self._to_device(torch.tensor([p[-1] for p in prompts], dtype=torch.int64))  # [B]
        draft_pending = [[p[-1]] for p in prompts]
        active = [True] * B
        policy = make_policy(self.policy_kind, self.k_max)
        alpha_est = AcceptanceEstimator(B)
        costs = copy.deepcopy(self.step_costs) if self.step_costs is not None else StepCosts()
        V = self.target.vocab_size
        step = 0
        phase = dict(draft=0.0, target=0.0, verify=0.0, steps=0, draft_steps=0)
        sync_mode = _SyncDebug(debug_sync and dev.type == "cuda")

        while any(active):
            K = policy.choose([alpha_est.alpha(b) for b in range(B) if active[b]], costs)
            timer = self._timer()
            with sync_mode:
                timer.mark()
                draft_ids = torch.empty(B, K, dtype=torch.int64, device=dev)
                draft_probs = None if greedy_all or K == 0 else torch.empty(B, K, V, dtype=torch.float32, device=dev)
                n_pending = [len(p) for p in draft_pending]
                if K > 0:
                    width = max(n_pending)
                    ids = torch.zeros(B, width, dtype=torch.int64)
                    for b, p in enumerate(draft_pending):
                        ids[b, :len(p)] = torch.tensor(p, dtype=torch.int64)
                    logits = self.draft.forward(self._to_device(ids))  # [B, width, V]
                    pend_dev = self._to_device(torch.tensor(n_pending, dtype=torch.int64))
                    if width > min(n_pending):
                        self.draft.rollback(width, torch.tensor(n_pending, dtype=torch.int64))
                    logits = _op_dtype(logits.gather(1, (pend_dev - 1).view(B, 1, 1).expand(B, 1, logits.shape[-1]))[:, 0])
                    for i in range(K):
                        probs_out = draft_probs[:, i] if draft_probs is not None else None
                        draft_ids[:, i] = sample(logits, temps_dev, seed=seed, offset=step * (k_max + 1) + i,
                                                 probs_out=probs_out)
                        if i + 1 < K:
                            logits = _op_dtype(self.draft.forward(draft_ids[:, i:i + 1])[:, 0])
                timer.mark()
                target_in = torch.cat([last_dev.view(B, 1), draft_ids], dim=1)  # [B, K+1]
                target_logits = _op_dtype(self.target.forward(target_in))  # [B, K+1, V]
                timer.mark()
                res = verify(target_logits, draft_ids, draft_probs, temps_dev, seed=seed, offset=step)
                timer.mark()
                packed = torch.cat([res.tokens, res.num_accepted.view(B, 1), res.valid.view(B, 1).long()], dim=1)
            host = packed.cpu().tolist()  # the step's ONE device -> host copy
            draft_s, target_s, verify_s = timer.read()
            phase["draft"] += draft_s
            phase["target"] += target_s
            phase["verify"] += verify_s
            phase["steps"] += 1
            phase["draft_steps"] += K
            if K > 0:
                costs.add_draft(draft_s / K)
            costs.add_target(K + 1, target_s)

            kept_t = torch.zeros(B, dtype=torch.int64)
            kept_d = torch.zeros(B, dtype=torch.int64)
            acc_pos = [0] * K
            step_gen = step_drafted = step_acc = 0
            for b in range(B):
                if not active[b]:  # finished: keeps nothing of this step (kept = 0)
                    continue
                row = host[b]  # [tokens (K+1), num_accepted, valid]
                if not row[K + 2]:
                    raise RuntimeError(f"verify flagged row {b} invalid (NaN/inf logits from the model?)")
                n = row[K + 1]
                emitted = row[:n + 1]
                room = max_new_tokens - len(generated[b])
                emitted = emitted[:room]
                for idx, t in enumerate(emitted):
                    if t in eos:
                        emitted = emitted[:idx + 1]
                        break
                m = len(emitted)
                generated[b].extend(emitted)
                st = stats[b]
                st.steps += 1
                st.drafted += K
                st.accepted += n
                st.rejections += int(n < K)
                st.tokens_generated += m
                st.ks.append(K)
                st.emitted.append(m)
                alpha_est.update(b, K, n)
                for i in range(n):
                    acc_pos[i] += 1
                step_gen, step_drafted, step_acc = step_gen + m, step_drafted + K, step_acc + n
                # target holds [last, d_1..d_(m-1)] of this step's K+1 entries
                kept_t[b] = m
                # draft processed pending (n_pending) + d_1..d_(K-1) this step (nothing if K = 0)
                if K > 0:
                    drafts_in_cache = min(m - 1, K - 1)
                    kept_d[b] = n_pending[b] + drafts_in_cache
                    draft_pending[b] = emitted[drafts_in_cache:]
                else:
                    draft_pending[b] = draft_pending[b] + emitted
                done = len(generated[b]) >= max_new_tokens or (m > 0 and emitted[-1] in eos)
                if done:
                    active[b] = False
            # finished rows keep nothing of this step in either cache
            self.target.rollback(K + 1, kept_t)
            if K > 0:
                self._rollback_draft(K, n_pending, kept_d)
            last_dev = self._to_device(torch.tensor([generated[b][-1] if generated[b] else prompts[b][-1]
                                                     for b in range(B)], dtype=torch.int64))
            if self.metrics is not None:
                self.metrics.record_step(K, step_drafted, step_acc, step_gen, acc_pos, draft_s, target_s, verify_s)
            step += 1
            if progress is not None:
                progress(sum(len(g) for g in generated))
        out = self._output(input_ids, generated, stats, pad, t_start)
        out.phase_s = phase
        return out

    def _rollback_draft(self, K: int, n_pending: List[int], kept_d: torch.Tensor) -> None:
        """The draft appended n_pending[b] real tokens (pads already rolled back) then
        K - 1 drafts: keep kept_d[b] of those n_pending[b] + K - 1 entries."""
        appended = torch.tensor(n_pending, dtype=torch.int64) + (K - 1)
        width = int(appended.max())
        # Rows appended different counts: express each row's rollback against the widest.
        self.draft.rollback(width, kept_d + (width - appended))

    # ------------------------------------------------------------------ checks / output
    def _check_inputs(self, input_ids, attention_mask):
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError("input_ids must be an int64 tensor [B, T]")
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
            attention_mask = None if attention_mask is None else attention_mask.view(1, -1)
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
        if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)}): every row needs a prompt")
        ids = input_ids.detach().cpu().long()
        if attention_mask is not None:
            if tuple(attention_mask.shape) != tuple(ids.shape):
                raise ValueError(f"attention_mask must have input_ids' shape {tuple(ids.shape)}, "
                                 f"got {tuple(attention_mask.shape)}")
            mask = attention_mask.detach().cpu().bool()
        else:
            mask = torch.ones_like(ids, dtype=torch.bool)
        prompts = [ids[b][mask[b]].tolist() for b in range(ids.shape[0])]
        V = self.target.vocab_size
        for b, p in enumerate(prompts):
            if not p:
                raise ValueError(f"row {b} of input_ids has an empty prompt (attention_mask is all 0)")
            bad = [t for t in p if not 0 <= t < V]
            if bad:
                raise ValueError(f"row {b} of input_ids holds ids outside [0, {V}): {bad[:5]}")
        return ids, prompts

    @staticmethod
    def _check_temperature(temperature, B) -> torch.Tensor:
        t = torch.as_tensor(temperature, dtype=torch.float32).detach().cpu()
        if t.dim() == 0:
            t = t.expand(B).clone()
        if tuple(t.shape) != (B,):
            raise ValueError(f"temperature must be a float or a tensor [B] = [{B}], got shape {tuple(t.shape)}")
        if not bool(((t >= 0) & torch.isfinite(t)).all()):
            raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {t.tolist()}")
        return t

    @staticmethod
    def _output(ids, generated, stats, pad, t_start) -> GenerationOutput:
        B, T = ids.shape
        G = max((len(g) for g in generated), default=0)
        seq = torch.full((B, T + G), pad, dtype=torch.int64)
        seq[:, :T] = ids
        for b, g in enumerate(generated):
            if g:
                seq[b, T:T + len(g)] = torch.tensor(g, dtype=torch.int64)
        return GenerationOutput(seq, generated, stats, time.perf_counter() - t_start)


def _op_dtype(logits: torch.Tensor) -> torch.Tensor:
    """The sampling ops read fp32/fp16/bf16; float64 models (tests) are cast to fp32."""
    return logits.float() if logits.dtype == torch.float64 else logits


class _HostTimer:
    """Phase times on the CPU (ops are synchronous there)."""

    def __init__(self):
        self.t: List[float] = []

    def mark(self):
        self.t.append(time.perf_counter())

    def read(self):
        return tuple(b - a for a, b in zip(self.t, self.t[1:]))


class _CudaTimer:
    """Phase times from CUDA events, read after the step's one sync (no extra syncs)."""

    def __init__(self):
        self.ev: List[torch.cuda.Event] = []

    def mark(self):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        self.ev.append(e)

    def read(self):
        return tuple(a.elapsed_time(b) / 1e3 for a, b in zip(self.ev, self.ev[1:]))


class _SyncDebug:
    """Context: torch.cuda.set_sync_debug_mode('error') while active (CUDA only)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __enter__(self):
        if self.enabled:
            torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc):
        if self.enabled:
            torch.cuda.set_sync_debug_mode("default")
        return False
