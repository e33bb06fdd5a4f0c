"""Prometheus metrics of the speculative engine (prometheus_client).

    metrics = specdec_ext.SpecDecMetrics()             # own registry, engine="default"
    engine = specdec_ext.SpeculativeEngine(target, draft, metrics=metrics)
    metrics.serve(9400)                                 # GET http://127.0.0.1:9400/metrics

Every metric carries an ``engine`` label, so two engines may share one registry (pass
``registry=`` and distinct ``engine=`` names) without colliding; by default each
SpecDecMetrics has a registry of its own.

| metric | type | meaning |
|---|---|---|
| speculative_tokens_generated_total | counter | tokens emitted |
| speculative_tokens_drafted_total | counter | draft tokens tested (each active row's K, per step) |
| speculative_tokens_accepted_total | counter | draft tokens accepted by verify |
| speculative_tokens_accepted_per_position_total{position} | counter | acceptances at draft position i (0-based) |
| speculative_steps_total | counter | engine steps (draft + verify rounds) |
| speculative_draft_latency_seconds | histogram | draft phase per step |
| speculative_target_latency_seconds | histogram | target forward per step |
| speculative_verify_latency_seconds | histogram | verify op per step |
| speculative_acceptance_rate | gauge | accepted / drafted over the last step |
| speculative_current_k | gauge | K of the last step (the largest row K; rows test their own) |
"""
from __future__ import annotations

import threading
import weakref

_LATENCY_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0)
_shared: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # registry -> collectors
_lock = threading.Lock()


def _collectors(registry) -> dict:
    """One set of collectors per registry (labelled by engine), created on first use."""
    from prometheus_client import Counter, Gauge, Histogram

    with _lock:
        if registry not in _shared:
            lab = ["engine"]
            _shared[registry] = dict(
                generated=Counter("speculative_tokens_generated", "Tokens emitted", lab, registry=registry),
                drafted=Counter("speculative_tokens_drafted", "Draft tokens proposed", lab, registry=registry),
                accepted=Counter("speculative_tokens_accepted", "Draft tokens accepted", lab, registry=registry),
                per_position=Counter("speculative_tokens_accepted_per_position",
                                     "Draft tokens accepted at each draft position", lab + ["position"],
                                     registry=registry),
                steps=Counter("speculative_steps", "Engine steps", lab, registry=registry),
                draft_latency=Histogram("speculative_draft_latency_seconds", "Draft phase latency", lab,
                                        buckets=_LATENCY_BUCKETS, registry=registry),
                target_latency=Histogram("speculative_target_latency_seconds", "Target forward latency", lab,
                                         buckets=_LATENCY_BUCKETS, registry=registry),
                verify_latency=Histogram("speculative_verify_latency_seconds", "Verify latency", lab,
                                         buckets=_LATENCY_BUCKETS, registry=registry),
                acceptance_rate=Gauge("speculative_acceptance_rate", "Accepted / drafted, last step", lab,
                                      registry=registry),
                current_k=Gauge("speculative_current_k", "K of the last step", lab, registry=registry),
            )
        return _shared[registry]


class SpecDecMetrics:
    """The engine's metrics in a Prometheus registry (see the module docstring)."""

    def __init__(self, registry=None, engine: str = "default"):
        """registry: a prometheus_client CollectorRegistry (default: a new one of its own)."""
        from prometheus_client import CollectorRegistry  # imported here: only metrics users need it

        self.registry = registry if registry is not None else CollectorRegistry()
        self.engine = engine
        c = _collectors(self.registry)
        self._c = c
        self.generated = c["generated"].labels(engine)
        self.drafted = c["drafted"].labels(engine)
        self.accepted = c["accepted"].labels(engine)
        self.steps = c["steps"].labels(engine)
        self.draft_latency = c["draft_latency"].labels(engine)
        self.target_latency = c["target_latency"].labels(engine)
        self.verify_latency = c["verify_latency"].labels(engine)
        self.acceptance_rate = c["acceptance_rate"].labels(engine)
        self.current_k = c["current_k"].labels(engine)

    def accepted_at(self, position: int):
        """Counter of acceptances at draft position ``position`` (0-based)."""
        return self._c["per_position"].labels(self.engine, str(position))

    def record_step(self, k: int, drafted: int, accepted: int, generated: int, accepted_per_position,
                    draft_s: float, target_s: float, verify_s: float) -> None:
        self.steps.inc()
        self.current_k.set(k)
        self.drafted.inc(drafted)
        self.accepted.inc(accepted)
        self.generated.inc(generated)
        for i, n in enumerate(accepted_per_position):
            if n:
                self.accepted_at(i).inc(n)
        if drafted:
            self.acceptance_rate.set(accepted / drafted)
        if k > 0:
            self.draft_latency.observe(draft_s)
        self.target_latency.observe(target_s)
        self.verify_latency.observe(verify_s)

    def serve(self, port: int, addr: str = "127.0.0.1"):
        """Serve ``/metrics`` over HTTP in a background thread: ``metrics.serve(9400)``.
        Returns the server (call ``.shutdown()`` to stop it)."""
        from prometheus_client import start_http_server

        started = start_http_server(port, addr=addr, registry=self.registry)
        return started[0] if isinstance(started, tuple) else started  # older clients return None
