"""Write the bundled pair's training corpus as raw uint16 token ids, for --datastore.

    python scripts/build_datastore.py --out /tmp/stdlib_corpus.u16 --max-tokens 4000000
    python -m specdec_ext.generate --prompt "def fibonacci(n):" --datastore /tmp/stdlib_corpus.u16

The corpus is the one scripts/train_tiny_pair.py trained the pair on (the standard library
of the Python running the script, minus the held-out files), encoded by the bundled
tokenizer, files joined by <|endoftext|>, the first --max-tokens ids kept. Retrieval
drafting (specdec_ext.Datastore) searches it when a row's own text has no match. The
package ships no datastore: the file's sha256 is printed so that runs can name the corpus.
"""
from __future__ import annotations

import argparse
import array
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_tiny_pair import corpus_files, encode, split  # noqa: E402

from specdec_ext import bundled  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the .u16 file to write")
    ap.add_argument("--max-tokens", type=int, default=1_000_000, help="corpus ids kept (default 1,000,000)")
    args = ap.parse_args()
    tok = bundled.load_tokenizer()
    _, files = corpus_files()
    train, _ = split(files)
    ids = encode(tok, train)[:args.max_tokens].tolist()  # Tensor [N] int64, ids < 4096
    buf = array.array("H", ids)
    if sys.byteorder != "little":
        buf.byteswap()
    data = buf.tobytes()
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"{args.out}: {len(ids)} tokens from {len(train)} files; sha256 {hashlib.sha256(data).hexdigest()}")


if __name__ == "__main__":
    main()
