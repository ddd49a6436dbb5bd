"""A SoftHSM2 token of the test process's own: a configuration and a token
directory in a temporary folder, the user PIN in a private file.

SoftHSM2 reads ``SOFTHSM2_CONF`` when the module is initialized, once per
process: the ``softhsm`` fixture (tests/conftest.py) sets it for the whole
test session, so that every pytest-xdist worker has tokens of its own.
Without SoftHSM2 the tests that need it are skipped, saying why; with
``CI=true`` its absence is a failure (``.ci/run`` installs it).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path
from urllib.parse import quote

MODULE_PATHS = (
    "/usr/lib/softhsm/libsofthsm2.so",
    "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/local/lib/softhsm/libsofthsm2.so",
)
#: The token every test may use (tokens are made in ``SoftHsm.__init__``).
TOKEN = "securepad"
#: A token no test logs in to with its right PIN (a login is a process's, and a
#: token this process is logged in to does not check a PIN again).
PIN_TRIALS_TOKEN = "pin-trials"


def find_softhsm() -> tuple[str, str] | None:
    """(the PKCS#11 module, softhsm2-util), or None when SoftHSM2 is not installed."""
    module = next((path for path in MODULE_PATHS if os.path.isfile(path)), None)
    util = shutil.which("softhsm2-util")
    return (module, util) if module and util else None


class SoftHsm:
    """Tokens under ``root``; ``uri`` names a key on one of them."""

    def __init__(self, root: Path, module: str, util: str) -> None:
        self.root, self.module, self.util = root, module, util
        self.user_pin = "4521-" + secrets.token_hex(4)
        self.so_pin = "9087-" + secrets.token_hex(4)
        (root / "tokens").mkdir(parents=True, exist_ok=True)
        self.conf = root / "softhsm2.conf"
        self.conf.write_text(
            f"directories.tokendir = {root / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n"
            "slots.removable = false\n"
        )
        self.pin_file = root / "user.pin"
        fd = os.open(self.pin_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(self.user_pin + "\n")
        for label in (TOKEN, PIN_TRIALS_TOKEN):
            self.init_token(label)

    def environ(self) -> dict[str, str]:
        """This process's environment with ``SOFTHSM2_CONF`` pointing at these tokens (for a child process)."""
        return {**os.environ, "SOFTHSM2_CONF": str(self.conf)}

    def init_token(self, label: str) -> None:
        """A new token labelled ``label`` in the first free slot."""
        subprocess.run(
            [self.util, "--init-token", "--free", "--label", label, "--pin", self.user_pin, "--so-pin", self.so_pin],
            check=True,
            env=self.environ(),
            capture_output=True,
        )

    def uri(self, label: str | None = None, *, token: str = TOKEN, pin: str = "file", extra: str = "") -> str:
        """A ``pkcs11:`` URI for the key ``label`` (a fresh one by default).

        ``pin``: ``"file"`` (pin-source=file:…), ``"env:NAME"``, ``"value"`` (pin-value=…, which the
        audit refuses) or ``"none"``."""
        label = label or "master-" + secrets.token_hex(4)
        query = [f"module-path={self.module}"]
        if pin == "file":
            query.append(f"pin-source=file:{quote(str(self.pin_file))}")
        elif pin.startswith("env:"):
            query.append(f"pin-source={pin}")
        elif pin == "value":
            query.append(f"pin-value={quote(self.user_pin)}")
        return f"pkcs11:token={quote(token)};object={quote(label)}{extra}?" + "&".join(query)
