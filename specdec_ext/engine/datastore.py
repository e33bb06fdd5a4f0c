"""Retrieval drafting from a fixed corpus (REST, He et al., NAACL 2024): a token datastore
searched through a suffix array, next to the row's own prompt-lookup index.

    ds = specdec_ext.Datastore(token_ids)                 # e.g. the target's training text
    engine = specdec_ext.SpeculativeEngine(target, None, k=16, datastore=ds)

A row drafts from its own text first (:class:`.ngram.NgramIndex`): when the row's last
``min_context_match`` or more tokens occurred earlier in its prompt or output, the tokens
that followed are the draft, as without a datastore. Otherwise the datastore drafts: the
longest suffix of the row's text (at most ``max_depth`` tokens) found in the corpus, then
its most frequent continuation, token by token, while the running continuation probability
stays >= ``min_prob`` (native: :class:`specdec_ext._suffix.TokenDatastore`,
csrc/core/token_datastore.h). Drafts are deterministic given the text, so verification
sees one-hot q, like any n-gram draft: the output law stays exactly the target's.

Memory: 8 bytes per corpus token (the tokens and their suffix array), built in about
0.3 s per million tokens on one core (1.0 s for the bundled pair's 3M-token training text). A proposal costs microseconds (binary searches).
"""
from __future__ import annotations

import array
import os
import sys
from typing import List, Optional, Sequence, Tuple

import torch

from .._validate import check_int
from .adaptive_k import draft_source
from .ngram import NgramIndex

__all__ = ["DATASTORE_SOURCE", "Datastore", "DatastoreRow"]

#: The source name of drafts from the datastore (see :class:`.adaptive_k.AcceptanceEstimator`).
DATASTORE_SOURCE = "datastore"

#: the suffix array is sorted this many tokens deep: matches plus drafts stay within it
SORT_DEPTH = 64
#: the files of a directory that :meth:`Datastore.from_path` reads
TEXT_SUFFIXES = (".py", ".txt", ".md")


def _native():
    try:
        from .. import _suffix
    except ImportError as e:  # pragma: no cover - a build without the module
        raise ImportError(f"Datastore needs specdec_ext._suffix (built by setup.py with the package); rebuild: {e}") from e
    return _suffix


def _token_buffer(tokens) -> array.array:
    """tokens (Tensor [N] integer, a NumPy array, a sequence of ints, or an int32 / uint16
    array.array) -> array('i' | 'H')."""
    if type(tokens).__module__ == "numpy" and hasattr(tokens, "dtype"):  # without importing numpy
        tokens = torch.as_tensor(tokens)
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() != 1:
            raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise TypeError(f"tokens must be an integer tensor, got {tokens.dtype}")
        tokens = tokens.detach().to("cpu", torch.int64)
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) > 2**31 - 1):
            raise ValueError(f"tokens must be in [0, 2^31 - 1], got min {int(tokens.min())}, max {int(tokens.max())}")
        return array.array("i", tokens.to(torch.int32).tolist())
    if isinstance(tokens, array.array) and tokens.typecode in ("i", "H"):
        return tokens
    out = array.array("i")
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int):
            raise TypeError(f"tokens[{i}] must be an int, got {type(t).__name__}")
        if not 0 <= t <= 2**31 - 1:
            raise ValueError(f"tokens[{i}] must be in [0, 2^31 - 1], got {t}")
        out.append(t)
    return out


class Datastore:
    """A fixed corpus of token ids that rows draft from when their own text has no match.

    Parameters
    ----------
    tokens : Tensor [N] integer, a NumPy array [N] integer, a sequence of ints, or
        array.array('i' | 'H'); ids >= 0
        (documents may be joined by an end-of-text id: a match never crosses it usefully)
    max_depth : int >= 1, the longest suffix of a row's text matched (at most 63)
    min_prob : float in [0, 1], a draft stops before its continuation probability drops below
    max_scan : int >= 1, corpus occurrences counted per draft token (evenly spaced beyond)
    min_context_match : int >= 1, a row's own-text match of this many tokens or more is
        preferred to the datastore (the row repeats itself: its own continuation is better)
    prior : float >= 0, pseudo-count in a continuation's probability count / (followed + prior),
        so that a continuation seen once or twice does not count as certain
    """

    def __init__(self, tokens, *, max_depth: int = 24, min_prob: float = 0.3, max_scan: int = 4096,
                 min_context_match: int = 2, prior: float = 2.0) -> None:
        self.max_depth = check_int("max_depth", max_depth, 1, SORT_DEPTH - 1)
        self.max_scan = check_int("max_scan", max_scan, 1)
        self.min_context_match = check_int("min_context_match", min_context_match, 1)
        if isinstance(min_prob, bool) or not isinstance(min_prob, (int, float)) or not 0.0 <= min_prob <= 1.0:
            raise ValueError(f"min_prob must be a number in [0, 1], got {min_prob!r}")
        self.min_prob = float(min_prob)
        if isinstance(prior, bool) or not isinstance(prior, (int, float)) or not 0.0 <= prior < float("inf"):
            raise ValueError(f"prior must be a finite number >= 0, got {prior!r}")
        self.prior = float(prior)
        buf = _token_buffer(tokens)
        self.max_token = max(buf) if len(buf) else -1
        self.native = _native().TokenDatastore(buf, SORT_DEPTH)

    @classmethod
    def from_file(cls, path: str, **kwargs) -> "Datastore":
        """A datastore from a raw file of little-endian uint16 token ids (``*.u16``, as
        scripts/build_datastore.py writes) or int32 ids (any other name)."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"datastore file {path!r} does not exist")
        buf = array.array("H" if path.endswith(".u16") else "i")
        size = os.path.getsize(path)
        if size % buf.itemsize:
            raise ValueError(f"datastore file {path!r} holds {size} bytes, not a whole number of "
                             f"{buf.itemsize}-byte tokens")
        with open(path, "rb") as f:
            buf.fromfile(f, size // buf.itemsize)
        if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
            buf.byteswap()
        return cls(buf, **kwargs)

    @classmethod
    def from_texts(cls, tokenizer, texts: Sequence[str], eot_id: Optional[int] = None, **kwargs) -> "Datastore":
        """A datastore of ``texts`` encoded by ``tokenizer`` (a ``tokenizers.Tokenizer`` or a
        transformers tokenizer), joined by ``eot_id`` when given."""
        ids: List[int] = []
        for text in texts:
            enc = tokenizer.encode(text)
            ids.extend(enc.ids if hasattr(enc, "ids") else enc)
            if eot_id is not None:
                ids.append(int(eot_id))
        return cls(ids, **kwargs)

    @classmethod
    def from_path(cls, path: str, tokenizer=None, eot_id: Optional[int] = None, **kwargs) -> "Datastore":
        """A datastore from ``path``: a token file (``*.u16`` / ``*.i32``, :meth:`from_file`), a
        text file, or a directory whose ``*.py``, ``*.txt`` and ``*.md`` files (recursively,
        in sorted order) are the corpus; text is encoded by ``tokenizer`` (:meth:`from_texts`)."""
        if path.endswith((".u16", ".i32")):
            return cls.from_file(path, **kwargs)
        if os.path.isdir(path):
            files = sorted(os.path.join(root, f) for root, _, names in os.walk(path) for f in names
                           if f.endswith(TEXT_SUFFIXES))
            if not files:
                raise ValueError(f"datastore directory {path!r} holds no {'/'.join(TEXT_SUFFIXES)} file")
        elif os.path.isfile(path):
            files = [path]
        else:
            raise FileNotFoundError(f"datastore path {path!r} does not exist")
        if tokenizer is None:
            raise ValueError(f"datastore {path!r} is text: it needs the target's tokenizer to encode it")
        texts = []
        for f in files:
            with open(f, encoding="utf-8", errors="replace") as fh:
                texts.append(fh.read())
        return cls.from_texts(tokenizer, texts, eot_id, **kwargs)

    def __len__(self) -> int:
        return int(self.native.size)

    def propose(self, context: Sequence[int], k: int) -> Tuple[List[int], int]:
        """(at most k draft tokens, the length of the matched suffix) after ``context``
        (its last ``max_depth`` tokens are matched); ([], 0) when nothing matches."""
        tokens, _, _, match = self.native.propose(list(context[-self.max_depth:]), k, self.max_depth,
                                                  self.min_prob, self.max_scan, self.prior)
        return tokens, int(match)

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ValueError when a corpus id is outside the target's vocabulary [0, V)."""
        if self.max_token >= vocab_size:
            raise ValueError(f"datastore holds token id {self.max_token}, outside the target's vocabulary "
                             f"[0, {vocab_size}): build it with the target's tokenizer")


class DatastoreRow:
    """One row's drafter (the interface of :class:`.ngram.NgramIndex`: ``extend``, ``propose``):
    its own text first, the datastore when that has no match of ``min_context_match`` tokens."""

    def __init__(self, datastore: Datastore, max_ngram: int) -> None:
        self.datastore = datastore
        self.local = NgramIndex(max_ngram)
        self.from_datastore = 0  # proposals the datastore made

    @property
    def text(self) -> List[int]:
        return self.local.text

    def extend(self, tokens: Sequence[int]) -> None:
        self.local.extend(tokens)

    def propose(self, k: int) -> List[int]:
        return self.propose_source(k)[0]

    def propose_source(self, k: int) -> Tuple[List[int], Optional[str]]:
        """(the draft, its source: ``ngramN`` from the row's own text (see
        :meth:`.ngram.NgramIndex.propose_source`), :data:`DATASTORE_SOURCE` from the
        datastore, None when neither has one). Prefix-consistent in k, as the n-gram draft."""
        own, n = self.local.propose_match(k)
        own_source = draft_source(n) if own else None
        if n >= self.datastore.min_context_match or k == 0:
            return own, own_source
        drafted, _ = self.datastore.propose(self.local.text, k)
        if drafted:
            self.from_datastore += 1
            return drafted, DATASTORE_SOURCE
        return own, own_source
