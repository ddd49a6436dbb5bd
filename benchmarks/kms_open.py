"""What a master key in AWS KMS costs against a key file: calls to KMS and
time, for an open, an owner's first read and a hot read, in a warm process
and in a new one (the command line's case). KMS is moto's server on
127.0.0.1 (started here), so a call's time is the emulator's, not a region's.

    python benchmarks/kms_open.py [--owners 40] [--rounds 20] [--cold 7]

Prints one JSON object: medians in milliseconds, calls as counted by the source.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from securepad import Keyring, Principal, Scratchpad
from tests.support.moto_kms import start_moto

SOURCES = ("key file", "aws-kms")

# A new process: import, keyring, open, one owner's first read; its times in ms.
COLD = """
import json, sys, time
t0 = time.perf_counter()
from securepad import Keyring, Principal, Scratchpad
t1 = time.perf_counter()
name, db, anchor, entry = sys.argv[1:5]
keyring = Keyring.from_uri(name) if name.startswith("aws-kms:") else Keyring.from_key_file(name)
pad = Scratchpad.open(db, keyring=keyring, anchor=anchor)
t2 = time.perf_counter()
pad.get(Principal("owner-0", "a", "c"), entry)
t3 = time.perf_counter()
print(json.dumps({"import": (t1 - t0) * 1e3, "keyring and open": (t2 - t1) * 1e3, "first read": (t3 - t2) * 1e3}))
"""


def _keyring(name: str) -> Keyring:
    return Keyring.from_uri(name) if name.startswith("aws-kms:") else Keyring.from_key_file(name)


def _calls(keyring: Keyring) -> int:
    return keyring.source.calls.total() if keyring.source is not None else 0


def _store(name: str, where: Path, owners: int) -> tuple[dict[str, Any], list[str]]:
    (where / "data").mkdir(parents=True)
    keyring = _keyring(name)
    with Scratchpad.open(where / "data" / "s.db", keyring=keyring, anchor=where / "anchor") as pad:
        made = _calls(keyring)
        ids = [
            pad.put(Principal(f"owner-{n}", "a", "c"), "t", 1, "x", "an observation " * 100)["scratchpad_id"]
            for n in range(owners)
        ]
        per_owner = (_calls(keyring) - made) / owners
    return {"calls: new store": made, "calls: new owner": per_owner}, ids


def _round(name: str, where: Path, ids: list[str], samples: dict[str, list[float]]) -> None:
    keyring = _keyring(name)
    before, start = _calls(keyring), time.perf_counter()
    pad = Scratchpad.open(where / "data" / "s.db", keyring=keyring, anchor=where / "anchor")
    samples.setdefault("open ms", []).append((time.perf_counter() - start) * 1e3)
    samples.setdefault("calls: open", []).append(_calls(keyring) - before)
    with pad:
        for n, entry in enumerate(ids):
            owner = Principal(f"owner-{n}", "a", "c")
            for kind in ("first read", "hot read"):
                before, start = _calls(keyring), time.perf_counter()
                pad.get(owner, entry)
                samples.setdefault(f"{kind} ms", []).append((time.perf_counter() - start) * 1e3)
                samples.setdefault(f"calls: {kind}", []).append(_calls(keyring) - before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--owners", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--cold", type=int, default=7)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kms-open-"))
    server = start_moto(tmp / "moto_server.log")
    try:
        os.environ |= {
            "AWS_ENDPOINT_URL_KMS": server.endpoint,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_CONFIG_FILE": str(tmp / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "none"),
        }
        names = {"key file": str(tmp / "key"), "aws-kms": "aws-kms://" + server.new_key()}
        results: dict[str, dict[str, Any]] = {}
        ids: dict[str, list[str]] = {}
        for source in SOURCES:
            results[source], ids[source] = _store(names[source], tmp / source.replace(" ", "-"), args.owners)
        samples: dict[str, dict[str, list[float]]] = {s: {} for s in SOURCES}
        for _ in range(args.rounds):  # the sources alternate, so that the machine's load falls on both
            for source in SOURCES:
                _round(names[source], tmp / source.replace(" ", "-"), ids[source], samples[source])
        colds: dict[str, list[dict[str, float]]] = {s: [] for s in SOURCES}
        for _ in range(args.cold):
            for source in SOURCES:
                where = tmp / source.replace(" ", "-")
                argv = [names[source], str(where / "data" / "s.db"), str(where / "anchor"), ids[source][0]]
                out = subprocess.run([sys.executable, "-c", COLD, *argv], capture_output=True, text=True, check=True)
                colds[source].append(json.loads(out.stdout))
        for source in SOURCES:
            for key, values in samples[source].items():
                results[source][key] = max(values) if key.startswith("calls") else round(statistics.median(values), 2)
            results[source]["new process ms"] = {
                k: round(statistics.median(c[k] for c in colds[source]), 1) for k in colds[source][0]
            }
        print(json.dumps(results, indent=1))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
