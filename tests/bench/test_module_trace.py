"""The modules a warm put and a warm tail read enter (``benchmarks/module_trace.py``): a count
that does not depend on the machine. A module entered only for a forward or a one-line check
stays out of the path once taken out of it."""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.module_trace import trace, warm_calls
from securepad import Keyring, Scratchpad

# Entered by neither call: the step's range, the host clock and a quiet commit's mark are
# tested in place; a query's rows are built by the statement's cached row maker.
NOT_ENTERED = {
    "put": {"securepad.principal", "securepad.core.timeline", "securepad.storage.anchor"},
    "read(tail)": {"securepad.principal", "securepad.storage.sqlite_rows", "securepad.storage.anchor"},
}
AT_MOST = {"put": 13, "read(tail)": 14}


def test_a_warm_put_and_tail_read_enter_only_the_modules_that_decide() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        keyring = Keyring.from_key_file(Path(tmp) / "key")
        with Scratchpad.open(Path(tmp) / "store.db", keyring=keyring) as pad:
            for name, call in warm_calls(pad).items():
                entered, _ = trace(call)
                assert not NOT_ENTERED[name] & set(entered), (name, entered)
                assert len(entered) <= AT_MOST[name], (name, entered)
