"""Time the key lifecycle at scale: rotate one owner's key over its entries,
then the master key over many owners.

    python -m benchmarks.key_rotation [--entries 100000] [--owners 10000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from securepad import Keyring, Principal, Scratchpad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000, help="entries of the owner whose key rotates")
    parser.add_argument("--owners", type=int, default=10_000, help="owners whose keys the master key re-wraps")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with Scratchpad.open(root / "store.db", keyring=Keyring.from_key_file(root / "key")) as pad:
            alice = Principal("alice", "agent", "bench")
            for i in range(args.entries):
                pad.put(alice, f"turn-{i // 1000}", i % 1000, "tool", f"observation {i} " * 20)
            started = time.perf_counter()
            report = pad.rotate_owner_key("alice")
            print(
                f"rotate-owner: {report['item_keys_rewrapped']:,} item keys re-wrapped in"
                f" {time.perf_counter() - started:.2f} s (complete={report['complete']})"
            )
            for i in range(args.owners):
                pad.put(Principal(f"owner-{i}", "agent", "bench"), "t", 1, "tool", "x")
            started = time.perf_counter()
            report = pad.rotate_master_key(Keyring.from_key_file(root / "key2"))
            print(
                f"rotate-master: {report['owner_keys_rewrapped']:,} owner keys re-wrapped in"
                f" {time.perf_counter() - started:.2f} s"
            )


if __name__ == "__main__":
    main()
