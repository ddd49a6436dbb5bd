"""A PostgreSQL outage does not flood stderr: psycopg_pool's warnings go through
the library's logger at a bounded rate (printed by the command line as
``warning:`` lines). The call deadline is set from Scratchpad.open, the policy
(``call_timeout_seconds``) and the command line (``--call-timeout``)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from securepad import InvalidArgumentError, Keyring, Policy, Scratchpad
from securepad.storage.postgres.log import POOL_LOGGER, PoolLogRelay, relay_pool_warnings
from securepad.store import parts
from tests.support.cli_runner import Cli, as_json, ok


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_relay_passes_one_warning_per_interval_and_counts_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    source = logging.getLogger("securepad.test.pool")
    source.propagate = False
    relay = PoolLogRelay(logging.getLogger("securepad.test.relayed"), interval_s=10, clock=clock)
    source.addHandler(relay)
    try:
        with caplog.at_level(logging.WARNING, logger="securepad.test.relayed"):
            for n in range(100):
                source.warning("error connecting in 'pool-1': refused %d", n)
            clock.now = 10.0
            source.warning("error connecting in 'pool-1': refused again")
    finally:
        source.removeHandler(relay)
    relayed = [r.getMessage() for r in caplog.records if r.name == "securepad.test.relayed"]
    assert relayed == [
        "PostgreSQL connection pool: error connecting in 'pool-1': refused 0",
        "PostgreSQL connection pool: error connecting in 'pool-1': refused again (99 more like it in the last 10 s)",
    ]


def test_a_pool_that_cannot_connect_prints_nothing_on_stderr(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from psycopg_pool import ConnectionPool

    relay_pool_warnings()
    pool_log = logging.getLogger(POOL_LOGGER)
    assert any(isinstance(h, PoolLogRelay) for h in pool_log.handlers)
    # The installed relay is the process's: an earlier test's pool may have used up its
    # interval. This test's pool gets a relay of its own, as a process's first pool would.
    handler = PoolLogRelay(logging.getLogger("securepad.postgres"))
    monkeypatch.setattr(pool_log, "handlers", [handler])
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="securepad.postgres"):
        pool: ConnectionPool = ConnectionPool(
            "postgresql://postgres@127.0.0.1:1/nothing", min_size=4, open=False, reconnect_timeout=0.5
        )
        pool.open(wait=False)
        try:
            deadline = time.monotonic() + 30
            while handler.held < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            pool.close()
    elapsed = time.monotonic() - started
    relayed = [r for r in caplog.records if r.name == "securepad.postgres"]
    assert handler.held >= 3 or len(relayed) >= 1
    assert 1 <= len(relayed) <= elapsed // 10 + 2  # one per interval at most
    assert "error connecting" in relayed[0].getMessage()
    assert capfd.readouterr().err == ""


def _limits(pad: Scratchpad) -> tuple[str, str]:
    row = parts(pad).db.query(
        "SELECT current_setting('lock_timeout') AS lock, current_setting('statement_timeout') AS statement"
    )[0]
    return str(row["lock"]), str(row["statement"])


def test_the_call_deadline_from_open_and_from_the_policy(pg_dsn: str, keyring: Keyring) -> None:
    with Scratchpad.open(pg_dsn, keyring=keyring) as default:
        assert _limits(default) == ("30s", "45s")
    with Scratchpad.open(pg_dsn, keyring=keyring, call_timeout_s=4) as quick:
        assert _limits(quick) == ("2s", "3s")
    with Scratchpad.open(pg_dsn, keyring=keyring, policy=Policy(call_timeout_seconds=2)) as from_policy:
        assert _limits(from_policy) == ("1s", "1500ms")
    for bad in (0, -1, float("nan"), float("inf"), True):
        with pytest.raises(InvalidArgumentError):
            Scratchpad.open(pg_dsn, keyring=keyring, call_timeout_s=bad)


def test_the_call_deadline_is_a_postgresql_option(tmp_path: Path, keyring: Keyring) -> None:
    with pytest.raises(InvalidArgumentError, match="call_timeout_s"):
        Scratchpad.open(tmp_path / "s.db", keyring=keyring, call_timeout_s=5)
    assert not (tmp_path / "s.db").exists()


def test_the_command_line_takes_a_call_deadline(cli: Cli) -> None:
    ok(cli("init"))
    bad = cli("--call-timeout", "soon", "stats")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: UsageError: ")
    if cli.backend == "sqlite":
        refused = cli("--call-timeout", "5", "stats")
        assert refused.exit_code == 1 and "PostgreSQL" in refused.stderr
        return
    assert as_json(cli("--json", "--call-timeout", "5", "stats"))["entries"] == 0
    assert as_json(cli("--json", "stats", env={"SECUREPAD_CALL_TIMEOUT": "2.5"}))["entries"] == 0
