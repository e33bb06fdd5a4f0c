"""Models the speculative engine can drive (see :class:`specdec_ext.models.base.SpecModel`).

Importing this package needs neither ``transformers`` nor ``safetensors``: loading a
safetensors checkpoint imports ``safetensors`` lazily.
"""
from .base import SpecModel
from .adapt import adapt
from .llama import LlamaConfig, LlamaModel, LlamaSpecModel
from .draft_head import DraftHead

__all__ = ["DraftHead", "LlamaConfig", "LlamaModel", "LlamaSpecModel", "SpecModel", "adapt"]
