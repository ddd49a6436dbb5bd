"""``turn recount``: the way out of a turn removed whole whose id the operator does not
know, asked for with a confirmation (or ``--yes``), and named by ``verify``."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager

from tests.support.cli_runner import Cli, as_json, ok, put
from tests.support.tamper_edits import Raw, as_admin, on_sqlite, remove_turn


def _raw(cli: Cli) -> AbstractContextManager[Raw]:
    return on_sqlite(cli.db) if cli.store is None else as_admin(cli.store)


def test_turn_recount_gives_up_a_removed_turn_and_lets_new_turns_in(cli: Cli) -> None:
    ok(cli("init"))
    put(cli, 1, "kept\n", turn="kept")
    put(cli, 1, "gone\n", turn="gone")
    with _raw(cli) as raw:
        remove_turn(raw, "gone", owner="bob")
    refused = cli("put", "--owner", "bob", "--turn", "new", "--step", "1", input="x")
    assert refused.exit_code == 1 and "not the ones it counts" in refused.stderr
    checked = cli("--json", "verify")
    report = json.loads(checked.stdout)
    assert checked.exit_code == 1 and not report["ok"]
    assert any("securepad turn recount" in p["problem"] for p in report["problems"])

    declined = cli("turn", "recount", "--owner", "bob", input="n\n")
    assert declined.exit_code == 1 and "Aborted" in declined.stderr
    assert cli("put", "--owner", "bob", "--turn", "new", "--step", "1", input="x").exit_code == 1  # nothing changed

    result = as_json(cli("--json", "turn", "recount", "--owner", "bob", "--yes"))
    assert (result["owner_user_id"], result["turns_before"], result["turns_after"]) == ("bob", 2, 1)
    assert (result["heads_deleted"], result["resealed"]) == ([], True)
    put(cli, 1, "new\n", turn="new")
    assert [e["summary"] for e in as_json(cli("--json", "list", "--owner", "bob", "--turn", "kept"))] == ["kept\n"]
    assert as_json(cli("--json", "verify"))["ok"] is True


def test_turn_recount_of_heads_that_add_up_says_nothing_changed(cli: Cli) -> None:
    ok(cli("init"))
    put(cli, 1)
    confirmed = ok(cli("turn", "recount", "--owner", "bob", input="y\n"))
    assert "1 turns counted before, 1 now (its heads added up: nothing changed)" in confirmed.stdout
    result = as_json(cli("--json", "turn", "recount", "--owner", "bob", "--yes"))
    assert (result["turns_before"], result["turns_after"], result["resealed"]) == (1, 1, False)
