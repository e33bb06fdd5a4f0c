"""The speculative decoding engine and what it is built from.

- :mod:`.engine`      :class:`SpeculativeEngine` (the driver of a run)
- :mod:`.phases`      draft / score / verify / rollback of one step
- :mod:`.tree`        tree speculation: the tree's shape and the phases of a tree step
- :mod:`.commit`      the pure host function deciding what each row emits and keeps
- :mod:`.run`         the host state of one run
- :mod:`.rng_keys`    which Philox offset each draw uses
- :mod:`.adaptive_k`  choosing K (Leviathan's model, acceptance estimates, step costs)
- :mod:`.metrics`     Prometheus metrics;  :mod:`.outputs`  what ``generate`` returns
- :mod:`.suffix`      suffix drafting (per-request and global suffix indexes)
- :mod:`.datastore`   retrieval drafting from a fixed corpus (suffix array)
- :mod:`.timing`      phase timers, the CUDA sync-debug guard
"""
from .datastore import Datastore
from .engine import SpeculativeEngine
from .metrics import SpecDecMetrics
from .outputs import GenerationOutput, PhaseTimes, RowStats
from .suffix import SuffixConfig

__all__ = ["Datastore", "GenerationOutput", "PhaseTimes", "RowStats", "SpecDecMetrics", "SpeculativeEngine", "SuffixConfig"]
