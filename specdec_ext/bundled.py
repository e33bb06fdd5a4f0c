"""The draft/target pair shipped with the package (trained by scripts/train_tiny_pair.py).

    target, draft = specdec_ext.bundled.load_pair()          # reference Llama models
    tok = specdec_ext.bundled.load_tokenizer()
    ids = tok.encode("def fibonacci(n):").ids

Both are Llama-architecture models in Hugging Face format (config.json, fp16
model.safetensors, tokenizer.json) trained on the Python standard library's source: a
~3M-parameter target and a one-layer draft (~6.5x fewer parameters) distilled from it.
``head/`` holds a draft head for the target (:func:`load_head`: drafts from the target's own
hidden state, no draft model). Everything loads
offline; the files' SHA-256 sums are recorded in checksums.json and checked on load, so
a corrupt install is a clear error rather than garbage output.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Dict, Tuple

import torch

PAIR_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "tiny_pair")
EOT_TOKEN = "<|endoftext|>"


class CorruptAssetError(RuntimeError):
    """A bundled file is missing or its checksum does not match checksums.json."""


def pair_dir(which: str) -> str:
    """Directory of the bundled 'target' or 'draft' checkpoint, or of the target's draft 'head'."""
    if which not in ("target", "draft", "head"):
        raise ValueError(f"which must be 'target', 'draft' or 'head', got {which!r}")
    return os.path.join(PAIR_DIR, which)


def verify_checksums(root: str = PAIR_DIR) -> Dict[str, str]:
    """Check every file listed in ``root/checksums.json``; raise CorruptAssetError naming
    the first missing or modified file. Returns the recorded sums."""
    listing = os.path.join(root, "checksums.json")
    if not os.path.exists(listing):
        raise CorruptAssetError(f"bundled model pair not found: {listing} is missing (reinstall specdec_ext)")
    with open(listing) as f:
        sums = json.load(f)
    for rel, expected in sums.items():
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            raise CorruptAssetError(f"bundled file {rel} is missing under {root} (reinstall specdec_ext)")
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != expected:
            raise CorruptAssetError(f"bundled file {rel} under {root} is corrupt: sha256 {h.hexdigest()[:16]}... "
                                    f"!= recorded {expected[:16]}... (reinstall specdec_ext)")
    return sums


def load_pair(device="cpu", dtype: torch.dtype = torch.float32, implementation: str = "reference",
              check: bool = True) -> Tuple[object, object]:
    """(target, draft) of the bundled pair.

    implementation : "reference" -> :class:`specdec_ext.models.LlamaModel` (the fast path);
                     "hf" -> ``transformers.LlamaForCausalLM``
    """
    if check:
        verify_checksums()
    if implementation == "reference":
        from .models import LlamaModel

        return tuple(LlamaModel.from_pretrained(pair_dir(w), dtype=dtype, device=device) for w in ("target", "draft"))
    if implementation == "hf":
        from transformers import LlamaForCausalLM

        return tuple(LlamaForCausalLM.from_pretrained(pair_dir(w), dtype=dtype).to(device).eval()
                     for w in ("target", "draft"))
    raise ValueError(f"implementation must be 'reference' or 'hf', got {implementation!r}")


def load_head(target, check: bool = True):
    """The bundled target's draft head (:class:`specdec_ext.models.DraftHead`, trained by
    scripts/train_draft_head.py) over ``target``, the bundled target loaded by the reference
    model (``load_pair()[0]``) on any device and dtype: the engine's ``drafter='head'``."""
    from .models import DraftHead

    if check:
        verify_checksums()
    return DraftHead.from_pretrained(pair_dir("head"), target)


def load_tokenizer(check: bool = False):
    """The pair's byte-level BPE tokenizer (``tokenizers.Tokenizer``)."""
    from tokenizers import Tokenizer

    if check:
        verify_checksums()
    return Tokenizer.from_file(os.path.join(pair_dir("target"), "tokenizer.json"))


def eos_token_id() -> int:
    return int(load_tokenizer().token_to_id(EOT_TOKEN))
