"""Drop-in shims with the shapes of other serving stacks' sampling APIs, each a thin layer
that packs their layout into the package's own ops (nothing here imports those stacks).

- :mod:`specdec_ext.compat.vllm`        vLLM v1's ``RejectionSampler`` (flat draft layout)
- :mod:`specdec_ext.compat.flashinfer`  FlashInfer's sampling API
"""
