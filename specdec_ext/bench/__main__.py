"""Microbenchmarks: python -m specdec_ext.bench {verify,kv,e2e,sass} [options] (--help per command)."""
import importlib
import sys

COMMANDS = {
    "verify": "specdec_ext.bench.verify",  # fused verify vs plain PyTorch / torch.compile / FlashInfer
    "kv": "specdec_ext.bench.kv",          # KV-cache append / gather vs indexing and copy
    "e2e": "specdec_ext.bench.e2e",        # engine on the bundled pair vs target-only and HF
    "sass": "specdec_ext.bench.sass",      # static SASS read of the built kernels (registers, spills, loads)
}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m specdec_ext.bench {{{','.join(COMMANDS)}}} [options]", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[argv[0]])
    except ImportError as e:
        print(f"benchmark '{argv[0]}' is not available in this build: {e}", file=sys.stderr)
        return 2
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
