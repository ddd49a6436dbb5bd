"""The cost of a master key held in a PKCS#11 token (SoftHSM2) against a key file.

    python benchmarks/master_key_sources.py [--runs 30]

Prints, for each source: the median time of an open (``Scratchpad.open`` of a
store of 20 owners, then close), of an owner's first read after an open (its
key unwrapped) and of a warm read; the calls each made into the token; and
the median latency of one AES-GCM encrypt and decrypt with associated data in
the token through python-pkcs11 (and through PyKCS11 when it is installed).
Run from the repository's root (it borrows the tests' SoftHSM2 set-up).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.softhsm import SoftHsm, find_softhsm

OWNERS = 20


def _median_ms(samples: list[float]) -> str:
    return f"{1000 * statistics.median(samples):.3f} ms"


def _stores(root: Path, hsm: SoftHsm) -> dict[str, Callable[[], object]]:
    from securepad import Keyring

    uri = hsm.uri("bench-master")
    key = root / "keys" / "key"
    return {"key file": lambda: Keyring.from_key_file(key), "pkcs11 (SoftHSM2)": lambda: Keyring.from_uri(uri)}


def _measure(stores: dict[str, tuple[Path, Callable[[], object]]], runs: int) -> dict[str, dict[str, str]]:
    """Each figure's median over ``runs``, the stores taking turns run by run (a shared
    machine's drift then weighs on both alike)."""
    from securepad import Principal, Scratchpad

    principals = [Principal(f"owner-{n}", "a", "c") for n in range(OWNERS)]
    ids: dict[str, list[str]] = {}
    for name, (db, make_keyring) in stores.items():
        with Scratchpad.open(db, keyring=make_keyring(), anchor=False) as pad:  # type: ignore[arg-type]
            ids[name] = [pad.put(p, "t", 1, "x", "an observation " * 40)["scratchpad_id"] for p in principals]
    samples: dict[str, dict[str, list[float]]] = {
        name: {"open": [], "first read": [], "warm read": []} for name in stores
    }
    calls: dict[str, dict[str, int]] = {}
    for run in range(runs):
        for name, (db, make_keyring) in stores.items():
            keyring = make_keyring()
            started = time.perf_counter()
            pad = Scratchpad.open(db, keyring=keyring, anchor=False)  # type: ignore[arg-type]
            opened = time.perf_counter()
            owner = run % OWNERS
            pad.get(principals[owner], ids[name][owner])
            first = time.perf_counter()
            pad.get(principals[owner], ids[name][owner])
            warm = time.perf_counter()
            pad.close()
            for figure, value in (
                ("open", opened - started),
                ("first read", first - opened),
                ("warm read", warm - first),
            ):
                samples[name][figure].append(value)
            source = getattr(keyring, "source", None)
            if source is not None:
                calls[name] = source.calls.snapshot()
    figures = {name: {k: _median_ms(v) for k, v in by.items()} for name, by in samples.items()}
    for name, snapshot in calls.items():
        figures[name]["token calls (last open and read)"] = str(snapshot)
    return figures


def _per_call(hsm: SoftHsm, runs: int) -> dict[str, str]:
    from securepad import Keyring

    keyring = Keyring.from_uri(hsm.uri("bench-per-call"))
    source = keyring.source
    assert source is not None
    source.prepare(create=True)
    key, aad = secrets.token_bytes(32), b"associated data of a wrapped owner key"
    enc, dec = [], []
    for _ in range(runs * 50):
        started = time.perf_counter()
        blob = source.encrypt(key, aad)
        sealed = time.perf_counter()
        source.decrypt(blob, aad)
        dec.append(time.perf_counter() - sealed)
        enc.append(sealed - started)
    figures = {"python-pkcs11 encrypt": _median_ms(enc), "python-pkcs11 decrypt": _median_ms(dec)}
    try:
        import PyKCS11
    except ImportError:
        return figures
    lib = PyKCS11.PyKCS11Lib()
    lib.load(hsm.module)
    slot = next(s for s in lib.getSlotList(tokenPresent=True) if lib.getTokenInfo(s).label.strip() == "securepad")
    session = lib.openSession(slot, PyKCS11.CKF_RW_SESSION | PyKCS11.CKF_SERIAL_SESSION)
    handle = session.findObjects([(PyKCS11.CKA_CLASS, PyKCS11.CKO_SECRET_KEY), (PyKCS11.CKA_LABEL, "bench-per-call")])[
        0
    ]
    enc, dec = [], []
    for _ in range(runs * 50):
        iv = secrets.token_bytes(12)
        started = time.perf_counter()
        blob = bytes(session.encrypt(handle, key, PyKCS11.AES_GCM_Mechanism(iv, aad, 128)))
        sealed = time.perf_counter()
        session.decrypt(handle, blob, PyKCS11.AES_GCM_Mechanism(iv, aad, 128))
        dec.append(time.perf_counter() - sealed)
        enc.append(sealed - started)
    return figures | {"PyKCS11 encrypt": _median_ms(enc), "PyKCS11 decrypt": _median_ms(dec)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    found = find_softhsm()
    if found is None:
        sys.exit("SoftHSM2 is not installed (apt-get install softhsm2)")
    root = Path(tempfile.mkdtemp(prefix="securepad-bench-"))
    try:
        hsm = SoftHsm(root / "softhsm", *found)
        os.environ["SOFTHSM2_CONF"] = str(hsm.conf)
        stores = {}
        for name, make_keyring in _stores(root, hsm).items():
            (root / name.split()[0]).mkdir()
            stores[name] = (root / name.split()[0] / "store.db", make_keyring)
        for name, figures in _measure(stores, args.runs).items():
            print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
        print(", ".join(f"{k} {v}" for k, v in _per_call(hsm, args.runs).items()))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
