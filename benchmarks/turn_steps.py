"""Turn.record late in a long turn, and a fresh-process resume of it (SQLite).

    python -m benchmarks.turn_steps [STEPS] [RUNS]

Records STEPS (default 1000) steps of 8 KiB text each into one turn (every
one offloaded under the default policy) and prints how long recording the
last step took (and the median of the last ten), then resumes the turn RUNS
times (default 9), each in a fresh process: open the store, ``pad.turn``,
``history()`` and ``tools()``; the import of securepad is not counted.
Not part of ``securepad bench``: a quick check of the
two runtime paths that used to grow with the turn's length.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from securepad import Keyring, Principal, Scratchpad

PRINCIPAL = Principal("alice", "planner", "web")
TEXT = ("x" * 63 + "\n") * 128  # 8 KiB

_RESUME = r"""
import sys, time
from securepad import Keyring, Principal, Scratchpad
start = time.perf_counter()
pad = Scratchpad.open(sys.argv[1], keyring=Keyring.from_key_file(sys.argv[2]))
turn = pad.turn(Principal("alice", "planner", "web"), "t1")
history, tools = turn.history(), turn.tools()
elapsed = time.perf_counter() - start
assert len(history) == int(sys.argv[3]) and tools
print(elapsed)
"""


def main(steps: int = 1000, runs: int = 9) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db, key = Path(tmp) / "store.db", Path(tmp) / "key"
        times = []
        with Scratchpad.open(db, keyring=Keyring.from_key_file(key)) as pad:
            turn = pad.turn(PRINCIPAL, "t1")
            for step in range(1, steps + 1):
                start = time.perf_counter()
                turn.record(step, "shell", TEXT)
                times.append(time.perf_counter() - start)
        print(
            f"record step {steps}: {times[-1] * 1e3:.2f} ms"
            f" (median of the last 10: {statistics.median(times[-10:]) * 1e3:.2f} ms; all {steps}: {sum(times):.1f} s)"
        )
        command = [sys.executable, "-P", "-c", _RESUME, str(db), str(key), str(steps)]
        resumes = [float(subprocess.check_output(command)) for _ in range(runs)]
        print(
            f"resume {steps} steps, fresh process x{runs}: median {statistics.median(resumes) * 1e3:.1f} ms"
            f" (min {min(resumes) * 1e3:.1f}, max {max(resumes) * 1e3:.1f})"
        )


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:3]))
