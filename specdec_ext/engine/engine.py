"""The speculative decoding engine: draft -> score -> verify -> commit -> rollback, batched.

One step (B rows, K drafts), each phase a function of :mod:`.phases`:

1. draft:    the draft catches up on its pending tokens, then samples K tokens with
             :func:`specdec_ext.sample` writing ``draft_probs[:, i]`` in place (no host sync);
2. score:    one target forward over [last committed token, d_1..d_K];
3. verify:   :func:`specdec_ext.verify` -> per-row accepted count and correction/bonus token;
4. commit:   ONE device->host copy of the step's result, then the pure host function
             :func:`.commit.commit_step` decides what each row emits (EOS / max_new_tokens
             cuts) and how many cache entries each model keeps;
5. rollback: both caches drop the rest on the device.

Both caches are prefilled with the prompt minus its last token, which is the first pending
token of both models. Rows have their own lengths, so ragged prompts and different
acceptance counts need no padding inside the caches. Rows stop independently and never
emit a token past EOS or max_new_tokens; a finished row keeps running in the batch (its
results are ignored and its caches are not advanced).

K per row (:class:`.adaptive_k.PerRowK`): each active row sampled at T > 0 chooses its own
K; greedy rows (and all rows in coupled mode), whose text does not depend on K, share one
choice from all their acceptance estimates and test every draft of the step. The step
drafts to the largest K and verify's ``num_drafts`` tells it each row's K. Finished rows
get K = 0 and are not counted in stats or metrics. With drafts from the text (n-gram,
hybrid, a datastore) the proposal is made first and K read from the estimate of its source
(a match of n tokens, the datastore, or the draft model for a hybrid row without a match,
:class:`.adaptive_k.AcceptanceEstimator`); only draft-model rows pay draft steps in the cost
model.

Sampling: temperature and the top-k / top-p / min-p filters (numbers or per-row tensors)
go to both the draft's :func:`specdec_ext.sample` (so ``draft_probs`` is the filtered q)
and :func:`specdec_ext.verify` (which tests against the filtered p'): the output follows
the filtered target law exactly.

Tree speculation (``tree=(b_1, .., b_D)``, :mod:`.tree`): the draft proposes a token tree
(b_l children per node at depth l - 1, one draft forward per depth), the target scores
every node in one forward with a tree attention mask, :func:`specdec_ext.verify_tree` walks
it (multi-draft speculative sampling), and both caches move the accepted path's entries to
the front of the step's (``compact``) before the usual rollback. The step's accounting is a
chain's with K = the tree's depth (``GenerationOutput.steps`` counts target passes).

Randomness and K: every draw is keyed by :class:`.rng_keys.StepKeys` (that module documents
seeds and offsets). With a ``seed`` the run is reproducible: adaptive K then uses a frozen
cost model (the models' parameter counts, see :func:`.adaptive_k.hinted_costs`) instead of
measured timings. In ``verify_mode="exact"`` a different K (or draft) gives a different,
equally exact, text at T > 0; in ``verify_mode="coupled"`` the text is target-only sampling
with the same seed, whatever K and the draft.
"""
from __future__ import annotations

import copy
import time
from typing import List, Optional, Sequence, Tuple, Union

import torch

from .._validate import check_int
from ..cache import TreeNodes
from ..errors import CacheFullError, OutOfBlocksError
from ..models.adapt import adapt
from ..ops._args import verify_mode_arg
from .adaptive_k import MODEL_SOURCE, PerRowK, StepCosts, hinted_costs
from .budget import BudgetPolicy
from .commit import commit_step
from .datastore import Datastore, DatastoreRow
from .head_tree import head_tree_step
from .inputs import SamplingArgs, check_eos, check_filters, check_prompts, check_seed, check_temperature_rows
from .metrics import SpecDecMetrics
from .outputs import GenerationOutput
from .ngram import NgramIndex
from .phases import (check_rows, draft_phase, drop_entries, ngram_drafts, override_drafts, prefill, score_phase,
                     shared_seed, verify_phase)
from .rng_keys import StepKeys
from .run import Run
from .suffix import GlobalSuffixCache, SuffixConfig, SuffixRow, suffix_tree_step
from .timing import SyncDebug, make_timer
from .tree import TREE_MODES, TreeShape, choose_depth, compact_caches, draft_entries, draft_tree, verify_tree_phase

__all__ = ["SpeculativeEngine"]

_POLICIES = {True: "cost", False: "fixed", "cost": "cost", "fixed": "fixed", "threshold": "threshold",
             "budget": "budget"}
_DRAFTERS = ("auto", "model", "ngram", "hybrid", "suffix", "head")
#: The source name of draft-head proposals (see :class:`.adaptive_k.AcceptanceEstimator`).
HEAD_SOURCE = "head"
#: Drafts the head proposes for a row without a prompt-lookup match (adaptive K may test
#: fewer): the bundled head's greedy chain agrees with the target's next tokens 44.8 / 21.0 /
#: 10.2 % of the time through depth 1 / 2 / 3 on held-out text, and each depth costs a few op
#: calls (~0.1 ms on a 2-core CPU); adaptive K then tests what pays.
HEAD_DRAFTS = 3
#: The head's default branching at the first draft (``head_branches``): over the target's
#: own greedy text the bundled head's first draft is right 67% of the time, its top two 78%;
#: two branches (3 + 2 nodes) took the main job from 48 to 43 target passes.
HEAD_BRANCHES = 2
#: Head trees run for batches of at most this many rows; larger ones draft chains. Each row's
#: tree widens the batch's target pass, and on the 2-core CPU two branches measured 1.07-1.10x
#: faster than chains at B = 1, 1.04x at B = 4 and 0.95x at B = 8 (bundled pair, 64 tokens).
HEAD_TREE_MAX_ROWS = 4


#: The frozen cost model of the drafters without a model (no timing, so a seeded run makes the
#: same K choices every time): a target pass over S tokens per row costs 1 + this * B * (S - 1)
#: one-token passes for a batch of B rows. On the bundled target (2-core CPU) a 17-token pass
#: measured 1.3-1.44 one-token passes at B = 1 and a 17-wide step of 8 rows about 2.6 plain
#: steps (2026-12-04). It keeps K near 1-2 where drafts from the text are rarely accepted
#: (sampling at T > 0) and lets it run to k_max on repetitive text (alpha >= 0.8).
TEXT_DRAFT_WIDTH_COST = 0.02


def default_verify_mode(tree, suffix, target) -> str:
    """The engine's verify_mode when none is given: "block" (the same law as token-wise
    verification, never fewer accepted drafts in expectation: measured +3-12% tokens per
    target pass with the bundled draft model at K = 2-6, T = 1; identical for one-hot drafts)
    wherever it applies; "exact" for trees (verify_tree has no block rule) and vocabulary-
    parallel targets (distributed.verify has none)."""
    trees = tree is not None or (isinstance(suffix, SuffixConfig) and suffix.tree)
    return "exact" if trees or getattr(target, "vocab_shard", None) is not None else "block"


def _drafter(draft, drafter: str):
    """(the draft model or None, 'model' | 'ngram' | 'hybrid' | 'suffix' | 'head') from the constructor's arguments."""
    if drafter not in _DRAFTERS:
        raise ValueError(f"drafter must be one of {_DRAFTERS}, got {drafter!r}")
    if drafter in ("suffix", "head"):
        if draft is not None and not isinstance(draft, str):
            raise ValueError(f"drafter={drafter!r} takes no draft model (pass draft=None)")
        return None, drafter
    if isinstance(draft, str):
        if draft != "ngram":
            raise ValueError(f"draft must be a model, None or 'ngram', got {draft!r}")
        draft = None
    if draft is None:
        if drafter in ("model", "hybrid"):
            raise ValueError(f"drafter={drafter!r} needs a draft model")
        return None, "ngram"
    if drafter == "ngram":
        raise ValueError("drafter='ngram' takes no draft model (pass draft=None or draft='ngram')")
    return draft, "model" if drafter == "auto" else drafter


class SpeculativeEngine:
    """Speculative decoding with a target and a draft model.

    Parameters
    ----------
    target : SpecModel | transformers.PreTrainedModel | specdec_ext LlamaModel
    draft : the same kinds, or None / "ngram" for prompt-lookup drafting (no draft model)
        A draft model has the target's vocabulary and device and is a distinct object (each
        owns a KV cache).
    k : int >= 0
        Drafts per step (the maximum when adaptive). 0 = plain decoding with the target.
    adaptive_k : bool | 'fixed' | 'cost' | 'threshold' | 'budget'
        False/'fixed': always k. True/'cost': each row's acceptance estimate and a cost
        model choose that row's K in [0, k] to maximise its expected tokens per second
        (greedy / coupled rows: one K for all of them, maximising their summed rate, or
        the largest K another row chose when that is larger).
        'threshold': a row's alpha below 40% -> K = 2, back to k when it recovers.
        'budget': one batch-wide plan (:mod:`.budget`) gives every row its K so that the
        step's expected emitted tokens per second is highest (at B = 1: 'cost'); exact law
        for every row, but a T > 0 row's text (exact mode) then depends on its batch.
    metrics : SpecDecMetrics, optional
        Prometheus metrics to update each step.
    pad_token_id : int, optional
        Fills ``sequences`` after a row stops (default: the smallest eos id, else 0).
    step_costs : StepCosts, optional
        The cost model adaptive K starts from. Default: frozen at the models' parameter
        ratio when ``generate`` gets a seed (reproducible), measured online otherwise; with
        n-gram drafting a draft step costs nothing.
    drafter : 'auto' | 'model' | 'ngram' | 'hybrid' | 'suffix' | 'head'
        'auto': the draft model if one is given, else n-gram. 'hybrid': n-gram drafts
        (:mod:`.ngram`: the tokens that followed the latest earlier occurrence of the row's
        last ``max_ngram``..1 tokens in its prompt and output, a loop that reaches the end of
        the text continued by repeating it) for rows that have a match,
        the draft model for the others; a step where every row has a match skips the draft
        model. n-gram drafts are deterministic: verify sees one-hot q and stays exact.
        'suffix' (:mod:`.suffix`, no draft model): drafts from a suffix index of the row's
        prompt and output and a global one of the engine's earlier outputs (kept across
        ``generate`` calls, bounded by ``suffix.max_cached_requests``), at most K tokens,
        also deterministic (one-hot q; trees with ``suffix=SuffixConfig(tree=True)``).
        'head' (no draft model, needs ``draft_head``): n-gram drafts where the row's text has a
        match, else the draft head's, read from the target's own last hidden state
        (:mod:`specdec_ext.models.draft_head`); deterministic too (one-hot q).
    suffix : SuffixConfig, optional (drafter 'suffix'): index depth, draft size, probability floor, cache bound, trees
    draft_head : DraftHead, optional (drafter 'head'): a head over this target
        (:class:`specdec_ext.models.DraftHead`, e.g. :func:`specdec_ext.bundled.load_head`); the
        target must expose its hidden states (:attr:`SpecModel.supports_hidden`: ``LlamaSpecModel``)
    head_branches : int >= 1 (drafter 'head'), default 2
        A step where the head drafts for a row scores a small tree for it (:mod:`.head_tree`):
        branch j starts with the head's (j+1)-th most likely first token and goes on greedily,
        max(1, K - j) nodes, verified by :func:`specdec_ext.verify_tree` (deterministic
        candidates: exact at any temperature; ``verify_mode`` 'block' and 'exact' are one rule
        for such drafts, so a tree step uses verify_tree under either). 1: a chain, verified
        like n-gram drafts. ``head_branches`` must not exceed the head's draft vocabulary.
        Needs :attr:`SpecModel.supports_tree`. Coupled mode, and batches of more than
        :data:`HEAD_TREE_MAX_ROWS` (4) rows, draft chains.
    datastore : Datastore, optional (drafters 'ngram' and 'hybrid'): a fixed corpus of token
        ids (:mod:`.datastore`, retrieval drafting) that drafts for a row whose own text has
        no match of ``datastore.min_context_match`` tokens; its ids must be < the target's
        vocabulary. Deterministic drafts like n-gram's: the law stays exact.
    max_ngram : int >= 1, the longest suffix matched by n-gram drafting
    verify_mode : None | 'exact' | 'coupled' | 'block'
        None (default): 'block' for chain speculation, 'exact' where block verification does
        not apply (``tree``, suffix trees, a vocabulary-parallel target). 'exact': Leviathan's ratio test (the draft's q is used; highest acceptance when q
        is a good approximation of p). 'block': block verification (:func:`specdec_ext.verify`
        ``mode="block"``): the same law, never fewer accepted drafts in expectation; more with
        the draft model's sampled drafts, the same as 'exact' for n-gram (one-hot) drafts. 'coupled': every token is keyed by (the row's seed,
        its position) and a draft is accepted iff it equals the target's own sample there
        (:mod:`.rng_keys`), so the text equals target-only sampling (k = 0) with the same
        seed, token for token, whatever K, the draft or (with per-row seeds) the batch.
        Both emit tokens that follow the (filtered) target law exactly.
    tree : sequence of ints >= 1, optional
        Tree speculation: the branching per depth, e.g. ``(4, 2, 2)`` = 4 candidates for the
        next token, 2 after each of them, 2 after each of those (1 + 4 + 8 + 16 = 29 nodes,
        depth 3). ``k`` and ``adaptive_k`` then play no part (the depth only shrinks near
        the end of a row's budget or of the caches). Needs a draft model (drafter 'auto' or
        'model') and models with :attr:`SpecModel.supports_tree` (``LlamaSpecModel``,
        ``HFBatchedSpecModel``), and ``verify_mode='exact'``.
    tree_mode : 'sampled' | 'topk'
        How the draft picks a node's children (rows at T > 0; greedy rows always take the
        draft's top-b). 'sampled': b i.i.d. draws from the draft's law q (verify_tree gets
        q: multi-draft speculative sampling). 'topk': the draft's b most likely tokens,
        deterministic candidates (no q). Both are exact.
    """

    def __init__(self, target, draft=None, k: int = 5, adaptive_k: Union[bool, str] = True,
                 metrics: Optional[SpecDecMetrics] = None, pad_token_id: Optional[int] = None,
                 step_costs: Optional[StepCosts] = None, drafter: str = "auto", max_ngram: int = 3,
                 verify_mode: Optional[str] = None, tree: Optional[Sequence[int]] = None,
                 tree_mode: str = "sampled", suffix: Optional[SuffixConfig] = None,
                 datastore: Optional[Datastore] = None, draft_head=None, head_branches: int = HEAD_BRANCHES):
        self.k_max = check_int("k", k, 0)
        if verify_mode is not None:
            verify_mode_arg(verify_mode, "verify_mode")
        self.max_ngram = check_int("max_ngram", max_ngram, 1)
        draft, self.drafter = _drafter(draft, drafter)
        if not isinstance(adaptive_k, (bool, str)) or adaptive_k not in _POLICIES:
            raise (ValueError if isinstance(adaptive_k, str) else TypeError)(
                f"adaptive_k must be True, False, 'fixed', 'cost', 'threshold' or 'budget', got {adaptive_k!r}")
        self.policy_kind = _POLICIES[adaptive_k]
        self.target = adapt(target)
        self.draft = None if draft is None else adapt(draft)
        self.verify_mode = verify_mode or default_verify_mode(tree, suffix, self.target)
        self.coupled = self.verify_mode == "coupled"
        self.models = [("target", self.target)] + ([("draft", self.draft)] if self.draft is not None else [])
        if self.target is self.draft:
            raise ValueError("target and draft are the same SpecModel object, so they would share one KV cache; "
                             "pass two wrappers (or the raw model twice: each role gets its own wrapper)")
        if self.draft is not None and self.target.vocab_size != self.draft.vocab_size:
            raise ValueError(f"draft vocabulary ({self.draft.vocab_size}) differs from the target's "
                             f"({self.target.vocab_size}): speculative decoding needs one vocabulary")
        if self.draft is not None and torch.device(self.target.device) != torch.device(self.draft.device):
            raise ValueError(f"target is on {self.target.device} but draft is on {self.draft.device}: "
                             "put both models on one device")
        if metrics is not None and not isinstance(metrics, SpecDecMetrics):
            raise TypeError(f"metrics must be a SpecDecMetrics, got {type(metrics).__name__}")
        if step_costs is not None and not isinstance(step_costs, StepCosts):
            raise TypeError(f"step_costs must be a StepCosts, got {type(step_costs).__name__}")
        self.device = torch.device(self.target.device)
        if tree_mode not in TREE_MODES:
            raise ValueError(f"tree_mode must be one of {TREE_MODES}, got {tree_mode!r}")
        self.tree = None if tree is None else self._check_tree(tree)
        self.tree_sampled = tree_mode == "sampled"
        self.metrics = metrics
        self.pad_token_id = None if pad_token_id is None else check_int("pad_token_id", pad_token_id)
        self.step_costs = step_costs
        self.suffix = self._check_suffix(suffix)
        self.datastore = self._check_datastore(datastore)
        self.head = self._check_head(draft_head)
        self.head_branches = check_int("head_branches", head_branches, 1)
        if self.head is not None and self.head_branches > 1 and not self.target.supports_tree:
            raise ValueError(f"head_branches={self.head_branches} drafts trees, which {type(self.target).__name__} "
                             "cannot score (supports_tree is False); pass head_branches=1")
        self._check_head_branches()

    def _check_head_branches(self) -> None:
        """head_branches distinct first drafts need a draft vocabulary of as many tokens
        (checked again at each generate: the head's vocabulary may have changed since)."""
        if self.head is not None and self.head_branches > self.head.draft_vocab_size:
            raise ValueError(f"head_branches={self.head_branches} exceeds the head's draft vocabulary of "
                             f"{self.head.draft_vocab_size} tokens (DraftHead.set_draft_vocab)")

    def _check_head(self, head):
        """The draft head (drafter 'head'), after checking that it reads this target."""
        from ..models.draft_head import DraftHead

        if self.drafter != "head":
            if head is not None:
                raise ValueError(f"draft_head= drafts for drafter='head', got drafter={self.drafter!r}")
            return None
        if head is None:
            raise ValueError("drafter='head' needs draft_head= (e.g. specdec_ext.bundled.load_head(target))")
        if not isinstance(head, DraftHead):
            raise TypeError(f"draft_head must be a specdec_ext.models.DraftHead, got {type(head).__name__}")
        if not self.target.supports_hidden:
            raise ValueError(f"drafter='head' reads the target's hidden states, which {type(self.target).__name__} "
                             "does not expose (use the reference LlamaModel)")
        if getattr(self.target, "model", None) is not head.target:
            raise ValueError("draft_head was made over another model than this target (DraftHead(target, ...) "
                             "reads its target's embedding, final norm and lm_head)")
        return head

    def _check_datastore(self, datastore: Optional[Datastore]) -> Optional[Datastore]:
        """The datastore (drafters 'ngram' and 'hybrid'), after checking it fits the target."""
        if datastore is None:
            return None
        if not isinstance(datastore, Datastore):
            raise TypeError(f"datastore must be a specdec_ext.Datastore, got {type(datastore).__name__}")
        if self.drafter not in ("ngram", "hybrid"):
            raise ValueError(f"datastore= drafts next to n-gram drafting (drafter 'ngram' or 'hybrid', or no draft "
                             f"model), got drafter={self.drafter!r}")
        datastore.check_vocab(self.target.vocab_size)
        return datastore

    def _check_suffix(self, config: Optional[SuffixConfig]) -> Optional[GlobalSuffixCache]:
        """The engine's global suffix index (drafter 'suffix'), after checking the config."""
        if config is not None and not isinstance(config, SuffixConfig):
            raise TypeError(f"suffix must be a SuffixConfig, got {type(config).__name__}")
        if self.drafter != "suffix":
            if config is not None:
                raise ValueError(f"suffix= configures drafter='suffix', got drafter={self.drafter!r}")
            return None
        config = config or SuffixConfig()
        if config.tree:
            if self.verify_mode != "exact":
                raise ValueError(f"suffix trees verify with verify_mode='exact' only, got {self.verify_mode!r}")
            if not self.target.supports_tree:
                raise ValueError(f"target model ({type(self.target).__name__}) does not support tree speculation "
                                 "(forward_tree and compact), which suffix trees need")
        return GlobalSuffixCache(config)

    def _check_tree(self, tree) -> TreeShape:
        """The tree's shape, after checking that this engine can speculate trees."""
        shape = TreeShape(tree)
        if self.draft is None or self.drafter != "model":
            raise ValueError(f"tree speculation needs a draft model that drafts every step (drafter 'auto' or "
                             f"'model'); drafter {self.drafter!r} proposes chains")
        if self.verify_mode != "exact":
            raise ValueError(f"tree speculation verifies with verify_mode='exact' only "
                             f"(verify_tree has no {self.verify_mode} mode), got {self.verify_mode!r}")
        for name, model in self.models:
            if not model.supports_tree:
                raise ValueError(f"{name} model ({type(model).__name__}) does not support tree speculation: it needs "
                                 "forward_tree and compact (LlamaSpecModel and HFBatchedSpecModel have them; the "
                                 "per-row HFSpecModel path cannot take a tree mask on its DynamicCache)")
        if max(shape.branching) > self.target.vocab_size:
            raise ValueError(f"tree branching {max(shape.branching)} exceeds the vocabulary ({self.target.vocab_size})")
        return shape

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: Union[float, torch.Tensor] = 0.0,
                 seed: Optional[int] = None, eos_token_id: Union[int, Sequence[int], None] = None,
                 attention_mask: Optional[torch.Tensor] = None, debug_sync: bool = False,
                 progress=None, *, top_k: Union[int, torch.Tensor, None] = None,
                 top_p: Union[float, torch.Tensor, None] = None,
                 min_p: Union[float, torch.Tensor, None] = None) -> GenerationOutput:
        """Generate up to ``max_new_tokens`` tokens per row.

        input_ids      : Tensor [B, T] int64 (a [T] tensor is one row). Padded rows need
                         ``attention_mask`` [B, T] of 0/1 (1 = token; left or right padding).
        temperature    : float >= 0 or Tensor [B] float; 0 = greedy (filters then ignored).
        top_k          : None, int >= 0 or Tensor [B] int (0 = off): keep the tokens whose
                         logit is >= the k-th largest.
        top_p          : None, float in (0, 1] or Tensor [B] float (1 = off): nucleus.
        min_p          : None, float in [0, 1) or Tensor [B] float (0 = off): keep v iff
                         p(v) >= min_p * max p. The filters apply in Hugging Face's warper
                         order (temperature, top-k, top-p, min-p; see :func:`specdec_ext.verify`).
        seed           : None (drawn from torch's generator), an int, or Tensor [B] int64 of
                         per-row seeds (a row's randomness then does not depend on its batch;
                         see :mod:`.rng_keys`).
        eos_token_id   : int or ints; a row stops after emitting one (it is emitted).
        debug_sync     : CUDA only: run every phase under torch.cuda.set_sync_debug_mode
                         ("error") (the one per-step device->host copy excepted).
        progress       : optional callable(tokens_done: int) called after each step.
        Returns a :class:`GenerationOutput`. Raises ``ValueError`` / ``TypeError`` for bad
        arguments, :class:`~specdec_ext.errors.CacheFullError` /
        :class:`~specdec_ext.errors.OutOfBlocksError` (naming the model) when a cache cannot
        hold the request (checked before the first forward), and
        :class:`~specdec_ext.errors.ModelOutputError` when a model's logits are unusable.
        """
        t_start = time.perf_counter()
        run = self._start(input_ids, max_new_tokens, temperature, seed, eos_token_id, attention_mask,
                          dict(top_k=top_k, top_p=top_p, min_p=min_p))
        sync = SyncDebug(debug_sync and self.device.type == "cuda")
        try:
            while any(run.active):
                self._step(run, sync)
                if progress is not None:
                    progress(run.tokens_done())
        finally:
            if self.head is not None:
                self.target.keep_hidden_states(False)
        return run.output(t_start)

    # ------------------------------------------------------------------ phases of a run
    def _start(self, input_ids, max_new_tokens, temperature, seed, eos_token_id, attention_mask, filters) -> Run:
        """Check the arguments, size and prefill both caches; the run's initial state."""
        self._check_head_branches()
        V = self.target.vocab_size
        ids, prompts = check_prompts(input_ids, attention_mask, V)
        B = len(prompts)
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, 0)
        temps = check_temperature_rows(temperature, B)
        filters = check_filters(B, **filters)
        eos, seed = check_eos(eos_token_id, V), check_seed(seed, B)
        if seed is None and self.target.vocab_shard is not None:  # every rank must draw the same numbers
            seed = shared_seed(self.target.vocab_shard.group)
        costs = self._costs(seed is not None, len(prompts))
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())  # CPU generator: no sync
        sampling = SamplingArgs(self._to_device(temps), {n: self._to_device(v) if isinstance(v, torch.Tensor) else v
                                                         for n, v in filters.items()},
                                self._to_device(seed) if isinstance(seed, torch.Tensor) else seed)
        pad = self.pad_token_id if self.pad_token_id is not None else (min(eos) if eos else 0)
        # plain decoding (k = 0) is keyed by position in both modes (rng_keys.py): "target-only
        # sampling with this seed" is one text, the one coupled mode reproduces for any K
        keys = (StepKeys(self.tree.num_nodes() - 1) if self.tree is not None
                else StepKeys(self.k_max, self.coupled or self.k_max == 0,
                              block=self.verify_mode == "block" and self.k_max > 0))
        run = Run(ids, prompts, max_new_tokens, eos, pad, sampling, bool((temps == 0).all()),
                  keys, self._policy(temps), costs,
                  self._to_device(torch.tensor([p[-1] for p in prompts], dtype=torch.int64)))
        run.draft_model = self.draft is not None
        self._set_positions(run)
        if self.suffix is not None:
            run.ngram = [SuffixRow(self.suffix, p) for p in prompts]
        elif self.drafter != "model":
            run.ngram = [NgramIndex(self.max_ngram) if self.datastore is None
                         else DatastoreRow(self.datastore, self.max_ngram) for _ in prompts]
            for index, p in zip(run.ngram, prompts):
                index.extend(p)
        if self.head is not None:
            self.target.keep_hidden_states(True)
        if max_new_tokens > 0:
            try:
                run.cache_len = self._prepare_caches(prompts, max_new_tokens)
            except BaseException:
                if self.head is not None:
                    self.target.keep_hidden_states(False)
                raise
            if self.head is not None:  # the prefill's last position produced each row's last prompt token
                self._keep_head_features(run, [len(p) - 2 for p in prompts])
        return run

    def _keep_head_features(self, run: Run, index: List[int]) -> None:
        """Keep, for the draft head, each row's final hidden state at position ``index[b]`` of the
        target's last forward (the one that produced the row's newest token); -1: none (a
        one-token prompt: the head does not draft for the row until its first step)."""
        B = len(index)
        run.head_ok = [i >= 0 for i in index]
        if not any(run.head_ok):
            run.head_feats = None
            return
        hidden = self.target.hidden_states()  # [B, S, H]
        if B == 1:  # a view (the forward made a new tensor): no index tensor, one op instead of three
            run.head_feats = hidden[:, max(index[0], 0)]  # [1, H]
            return
        S = hidden.shape[1]
        flat = self._to_device(torch.tensor([b * S + max(i, 0) for b, i in enumerate(index)], dtype=torch.int64))
        run.head_feats = hidden.reshape(B * S, -1).index_select(0, flat)  # [B, H]

    def _policy(self, temps: torch.Tensor) -> PerRowK:
        """Per-row K; greedy rows, and every row in coupled mode, share one choice (their
        text does not depend on K); 'budget': one plan for every row. temps: Tensor [B] float32 CPU."""
        if self.policy_kind == "budget":
            return BudgetPolicy(self.k_max)
        shared = range(len(temps)) if self.coupled else (temps == 0).nonzero().flatten().tolist()
        return PerRowK(self.policy_kind, self.k_max, len(temps), frozenset(shared))

    def _costs(self, seeded: bool, rows: int) -> StepCosts:
        """The cost model adaptive K starts from (see the ``step_costs`` parameter), for a
        batch of ``rows`` rows."""
        if self.step_costs is not None:
            return copy.deepcopy(self.step_costs)
        if self.draft is None:  # n-gram / suffix drafting costs about nothing; a wider pass does not
            return StepCosts(draft_guess=0.0, target_guess=1.0, frozen=True, target_slope=TEXT_DRAFT_WIDTH_COST * rows)
        if seeded:  # reproducible: K must not follow measured timings
            # hybrid: its text drafts would take k_max every step on a flat curve; the text drafters' width cost
            slope = TEXT_DRAFT_WIDTH_COST * rows if self.drafter == "hybrid" else 0.0
            return (hinted_costs(self.target.step_cost_hint, self.draft.step_cost_hint, slope)
                    or StepCosts(frozen=True, target_slope=slope))
        return StepCosts(freeze_after=16)  # measured over a warm-up, then frozen: K does not follow timing noise

    def _set_positions(self, run: Run) -> None:
        """Coupled mode: each row's next position, on the device (the key of its samples)."""
        if run.keys.coupled:
            run.positions = self._to_device(torch.tensor(run.next_positions(), dtype=torch.int64))

    def _prepare_caches(self, prompts, max_new_tokens: int) -> int:
        """Reset both models for the batch and check, before any forward, that each row fits.
        A row needs its prompt plus max_new_tokens - 1 positions (the last emitted token is
        never fed, and K is clipped to the budget left). A finished row keeps running in the
        batch, so the caches get k + 1 positions of slack (a tree: its N nodes) where the
        models allow (K, or the tree's depth, is clipped to the room left, see
        :meth:`Run.choose_ks` and :func:`.tree.choose_depth`). Returns the cache length."""
        need = [len(p) + max_new_tokens - 1 for p in prompts]
        caps = [m.max_positions for _, m in self.models if m.max_positions is not None]
        slack = self.k_max + 1 if self.tree is None else self.tree.num_nodes()
        cache_len = min([max(need) + slack] + caps)
        for name, model in self.models:
            if model.max_positions is not None and max(need) > model.max_positions:
                raise CacheFullError(f"{name} model: a prompt of {max(len(p) for p in prompts)} tokens + "
                                     f"max_new_tokens ({max_new_tokens}) - 1 = {max(need)} positions exceed its "
                                     f"capacity of {model.max_positions}")
            try:
                model.reset(len(prompts), cache_len)
                model.reserve([min(cache_len, n + slack) for n in need])
            except (CacheFullError, OutOfBlocksError) as e:
                raise type(e)(f"{name} model: {e}") from e
        for _, model in self.models:
            prefill(model, prompts, self._to_device)
        return cache_len

    def _step(self, run: Run, sync: SyncDebug) -> None:
        """One draft -> score -> verify -> commit -> rollback step of the whole batch."""
        if self.tree is not None:
            return self._tree_step(run, sync)
        if self.suffix is not None and self.suffix.config.tree:
            return suffix_tree_step(self, run, sync)
        t0 = time.perf_counter()
        timer = make_timer(self.device)
        timer.mark()  # the draft phase starts here: it holds the text lookup of a head step
        text = None
        if (self.head is not None and self.head_branches > 1 and not run.keys.coupled
                and len(run.prompts) <= HEAD_TREE_MAX_ROWS):
            text = self._propose(run, head=False)
            if any(self._head_rows(run, text[0])):  # the head drafts for a row: a tree step
                return head_tree_step(self, run, sync, text, HEAD_SOURCE, HEAD_DRAFTS, t0, timer)
        with sync:
            props, sources = self._propose(run) if text is None else text
            ks = run.choose_ks(sources)
            self._trim_finished(run, max(ks, default=0) + 1)
            ks, draft_ids, draft_probs, how = self._draft(run, ks, props)
            k = draft_ids.shape[1]
            timer.mark()
            logits = score_phase(self.target, run.last, draft_ids)
            timer.mark()
            num_drafts = None if all(kb == k for kb in ks) else self._to_device(torch.tensor(ks, dtype=torch.int64))
            offset = run.keys.verify(run.step, run.positions)
            packed = verify_phase(logits, draft_ids, draft_probs, run.sampling, offset, num_drafts, run.keys.mode,
                                  self.target.vocab_shard)
            timer.mark()
        rows = packed.cpu().tolist()  # the step's ONE device -> host copy
        check_rows(rows, k, run.active, run.step)
        n_pending = [len(p) for p in run.pending]
        commits = commit_step(rows, k, run.active, run.pending, [len(g) for g in run.generated],
                              run.max_new_tokens, run.eos, how, ks)
        drop_entries(self.target, [k + 1 - (c.kept_target if c else 0) for c in commits])
        if k > 0 and how[0] != "idle":  # the draft model appended its pending tokens and d_1..d_(K-1)
            drop_entries(self.draft, [n + k - 1 - (c.kept_draft if c else 0) for n, c in zip(n_pending, commits)])
        if self.head is not None:  # target entry kept_target - 1 produced the row's last emitted token
            self._keep_head_features(run, [c.kept_target - 1 if c else -1 for c in commits])
        run.apply(commits, k)
        run.last = self._to_device(torch.tensor(run.last_tokens(), dtype=torch.int64))
        self._set_positions(run)
        self._account(run, k, commits, timer.read(), time.perf_counter() - t0, model_drafted=how[0] != "idle")

    def _tree_step(self, run: Run, sync: SyncDebug) -> None:
        """One tree step (:mod:`.tree`): draft the tree -> score every node -> verify_tree ->
        compact both caches -> commit and roll back as a chain of K = the step's depth."""
        t0 = time.perf_counter()
        timer = make_timer(self.device)
        shape, B = self.tree, len(run.prompts)
        depth = choose_depth(shape, run)
        N, parents = shape.num_nodes(depth), shape.parents_on(depth, self.device)
        self._trim_finished(run, N)
        with sync:
            timer.mark()
            if depth > 0:
                tree_ids, draft_probs = draft_tree(self.draft, run.pending, shape, depth, run.last, run.sampling,
                                                   run.keys, run.step, self.tree_sampled,
                                                   self.tree_sampled and not run.greedy, self._to_device)
            else:  # no room or budget for drafts: a plain target step
                tree_ids, draft_probs = run.last.view(B, 1), None
            timer.mark()
            logits = self.target.forward_tree(tree_ids.clamp(min=0), TreeNodes(parents))
            timer.mark()
            result, packed = verify_tree_phase(logits, tree_ids, parents, draft_probs, run.sampling,
                                               run.keys.verify(run.step), depth)
            timer.mark()
            compact_caches(self.target, self.draft if depth > 0 else None, result, shape, depth)
        rows = packed.cpu().tolist()  # the step's ONE device -> host copy
        check_rows(rows, depth, run.active, run.step)
        appended = draft_entries(shape, depth, [len(p) for p in run.pending])
        commits = commit_step(rows, depth, run.active, run.pending, [len(g) for g in run.generated],
                              run.max_new_tokens, run.eos, ["drafted" if depth > 0 else "idle"] * B)
        drop_entries(self.target, [N - (c.kept_target if c else 0) for c in commits])
        if depth > 0:
            drop_entries(self.draft, [n - (c.kept_draft if c else 0) for n, c in zip(appended, commits)])
        run.apply(commits, depth)
        run.last = self._to_device(torch.tensor(run.last_tokens(), dtype=torch.int64))
        self._account(run, depth, commits, timer.read(), time.perf_counter() - t0, width=N)

    def _trim_finished(self, run: Run, width: int) -> None:
        """Make room for a step of ``width`` entries per row in the finished rows' caches (their
        output is final; they still run in the batch): drop their newest entries."""
        counts = run.trim_finished(width)
        if any(counts):
            drop_entries(self.target, counts)
            if self.draft is not None:
                drop_entries(self.draft, counts)

    def _propose(self, run: Run, head: bool = True):
        """(each row's text proposal of up to k_max tokens, each row's draft source) before K
        is chosen, so that K follows the kind of draft (:class:`.adaptive_k.AcceptanceEstimator`):
        prompt lookup and the datastore, whose drafts are prefixes of longer ones. A row with
        no proposal drafts with the draft model (hybrid: source "model") or not at all. (None,
        None) for the draft-model and suffix drafters: K is chosen first, from one estimate
        per row, and the suffix index proposes for that K."""
        if run.ngram is None or self.suffix is not None:
            return None, None
        props, sources = [], []
        for b, index in enumerate(run.ngram):
            prop, source = index.propose_source(self.k_max) if run.active[b] else ([], None)
            props.append(prop)
            sources.append(MODEL_SOURCE if source is None and self.draft is not None else source)
        if self.head is not None and head:
            self._head_proposals(run, props, sources)
        return props, sources

    def _head_proposals(self, run: Run, props: List[List[int]], sources: List[Optional[str]]) -> None:
        """Fill in the draft head's proposal (source "head") for the active rows that have no
        prompt-lookup match, in one batched call (one device -> host copy of the drafts)."""
        rows = [b for b, use in enumerate(self._head_rows(run, props)) if use]
        depth = min(self.k_max, HEAD_DRAFTS)
        if not rows or depth == 0:
            return
        drafts = self.head.propose(*self._head_inputs(run, rows), depth).cpu().tolist()
        for b, d in zip(rows, drafts):
            props[b], sources[b] = d, HEAD_SOURCE

    def _head_inputs(self, run: Run, rows: List[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(features [R, H], newest tokens [R] int64) of the given rows, for the draft head."""
        feats, last = run.head_feats, run.last  # [B, H], [B]
        if len(rows) < len(run.prompts):
            index = self._to_device(torch.tensor(rows, dtype=torch.int64))
            feats, last = feats.index_select(0, index), last.index_select(0, index)
        return feats, last

    @staticmethod
    def _head_rows(run: Run, props: List[List[int]]) -> List[bool]:
        """Whether the head drafts for each row: an active row with a kept feature and no
        text proposal."""
        return [run.active[b] and not props[b] and run.head_ok[b] for b in range(len(props))]

    def _draft(self, run: Run, ks: List[int], props: Optional[List[List[int]]] = None):
        """(each row's K, draft_ids [B, K], draft_probs [B, K, V] or None, what the draft model
        did per row), K = the step's largest row K. Text proposals (``props``, from
        :meth:`_propose`, cut to each row's K; proposed here for the suffix drafter) where the
        drafter uses them: a step where every row that drafts has one runs without the draft
        model (a row tests only its proposal); otherwise the draft model drafts to the largest
        K of the rows without one (the others' K is cut to it) and the rows with a proposal
        take it instead (q one-hot there, the row tests only its proposal)."""
        B = len(ks)
        if props is None:
            props = [run.ngram[b].propose(ks[b]) if run.ngram is not None and run.active[b] else [] for b in range(B)]
        else:
            props = [p[:kb] for p, kb in zip(props, ks)]
        if self.draft is None or (self.drafter == "hybrid" and all(props[b] for b in range(B) if ks[b])):
            ks = [min(kb, len(p)) for kb, p in zip(ks, props)]
            return ks, ngram_drafts(props, max(ks), self._to_device), None, ["idle"] * B
        if self.drafter == "hybrid":  # the draft model runs for the rows without a proposal: their K bounds the step
            k_model = max(kb for b, kb in enumerate(ks) if not props[b])
            ks = [min(kb, k_model) for kb in ks]
            props = [p[:kb] for p, kb in zip(props, ks)]
        k = max(ks)
        want_probs = not run.greedy and not run.keys.coupled  # coupled verify does not read q
        draft_ids, draft_probs = draft_phase(self.draft, run.pending, k, run.sampling, run.keys, run.step,
                                             run.positions, want_probs, self._to_device)
        rows = [b for b in range(B) if props[b]] if k > 0 else []
        draft_ids, draft_probs = override_drafts(draft_ids, draft_probs, props, rows, self._to_device)
        ks = [min(ks[b], len(props[b])) if b in rows else ks[b] for b in range(B)]
        how = ["idle" if k == 0 else ("overridden" if b in rows else "drafted") for b in range(B)]
        return ks, draft_ids, draft_probs, how

    def _account(self, run: Run, k: int, commits, phases, step_s: float, width: Optional[int] = None,
                 model_drafted: bool = True) -> None:
        """Phase times, the cost model's measurements and the metrics of one step (K: the
        step's largest row K, or a tree's depth; the metrics count each active row's K;
        ``width``: tokens per row of the target forward, default K + 1; ``model_drafted``:
        the draft model drafted, so the step measured its cost: a step of text drafts did not)."""
        draft_s, target_s, verify_s = phases
        p = run.phase
        p.draft, p.target, p.verify = p.draft + draft_s, p.target + target_s, p.verify + verify_s
        p.other += max(0.0, step_s - draft_s - target_s - verify_s)
        if k > 0 and model_drafted:
            run.costs.add_draft(draft_s / k)
        run.costs.add_target(k + 1 if width is None else width, target_s)
        if self.metrics is not None:
            done = [c for c in commits if c is not None]
            self.metrics.record_step(k, sum(c.tested for c in done), sum(c.accepted for c in done),
                                     sum(len(c.emitted) for c in done),
                                     [sum(c.accepted > i for c in done) for i in range(k)], draft_s, target_s, verify_s)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Host -> device without a host sync (pinned + non_blocking on CUDA)."""
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)


