"""Microbenchmarks: python -m specdec_ext.bench COMMAND [options] (COMMAND --help for each).

With no command or -h / --help: the commands and what each compares (exit 0); an unknown
command: an error and the same list on stderr (exit 2)."""
import importlib
import sys

# command -> (module, what it compares); the listing prints them in this order
COMMANDS = {
    "verify": ("specdec_ext.bench.verify",
               "the fused verify (and sample) op vs plain PyTorch, torch.compile and FlashInfer"),
    "filtered": ("specdec_ext.bench.filtered",
                 "filtered_probs vs sample(probs_out=) and plain PyTorch warpers; logprobs vs log_softmax + topk"),
    "kv": ("specdec_ext.bench.kv",
           "KV-cache append / paged gather ops vs PyTorch indexing and a plain copy of the same bytes"),
    "linear": ("specdec_ext.bench.linear",
               "skinny_linear vs F.linear over a model's weights at the row counts of a verification pass"),
    "e2e": ("specdec_ext.bench.e2e",
            "the engine on the bundled pair vs target-only decoding and Hugging Face generate (plain and assisted)"),
    "distributed": ("specdec_ext.bench.distributed",
                    "vocab-parallel verify over P gloo ranks vs all_gather of the logits + verify (time, bytes)"),
    "sass": ("specdec_ext.bench.sass",
             "static read of the built CUDA kernels' SASS (registers, spills, loads); no timing"),
}
USAGE = f"usage: python -m specdec_ext.bench {{{','.join(COMMANDS)}}} [options]"


def listing() -> str:
    """The usage line, then one line per command with what it compares."""
    width = max(map(len, COMMANDS))
    lines = [USAGE, "", "commands:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    lines += ["", "Each writes its rows as JSON with --json PATH (with the machine's load while timed); "
              "benchmarks/check_targets.py judges them.",
              "python -m specdec_ext.bench COMMAND --help: that command's options."]
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(listing())
        return 0
    if argv[0] not in COMMANDS:
        print(f"python -m specdec_ext.bench: error: unknown command {argv[0]!r}\n{listing()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[argv[0]][0])
    except ImportError as e:
        print(f"benchmark '{argv[0]}' is not available in this build: {e}", file=sys.stderr)
        return 2
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
