"""A key file that opens several stores is never replaced: ``init`` says which key
file a store uses and whether it already existed, ``keys rotate-master
--install`` refuses a key file not recorded to open this store alone, and no
advice moves a new key over an existing one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from securepad.cli.key_files import key_file_use, record_key_file_use
from tests.support.cli_runner import Cli, as_json, ok, put


@pytest.mark.sqlite_only
def test_init_says_which_key_file_a_store_uses_and_whether_it_existed(cli: Cli) -> None:
    first = ok(cli("init")).stdout
    assert f"key file {cli.key}: created for this store" in " ".join(first.split())
    second = ok(cli("--db", "project.db", "init")).stdout
    assert f"key file {cli.key}: already existed" in " ".join(second.split())
    assert "also opens 1 other store" in " ".join(second.split())
    again = as_json(cli("--json", "--db", "project.db", "init"))
    assert again["key_file"] == str(cli.key) and again["key_file_created"] is False
    assert len(again["key_file_other_stores"]) == 1 and again["key_file_record_complete"] is True


def test_install_refuses_a_key_file_that_opens_another_store(cli: Cli, tmp_path: Path) -> None:
    ok(cli("init"))
    ok(cli("--db", str(tmp_path / "project.db"), "init"))  # reuses the default key file
    put(cli, 1)
    key_before = cli.key.read_bytes()
    refused = cli("--db", str(tmp_path / "project.db"), "keys", "rotate-master", "--install")
    assert refused.exit_code == 1 and "error: InvalidArgumentError:" in refused.stderr
    assert "other store" in refused.stderr and "--new-key-file" in refused.stderr
    assert cli.key.read_bytes() == key_before
    assert not cli.key.with_name("key.new").exists()
    # Both stores still open with the key file, the first one's entry readable.
    ok(cli("stats"))
    ok(cli("--db", str(tmp_path / "project.db"), "stats"))


def test_install_refuses_a_key_file_without_a_complete_record(cli: Cli) -> None:
    ok(cli("init"))
    use = key_file_use(cli.key)
    use.record.unlink()  # a key file made before stores were recorded beside it
    ok(cli("stats"))  # records this store, but cannot know of others
    assert key_file_use(cli.key).complete is False
    refused = cli("keys", "rotate-master", "--install")
    assert refused.exit_code == 1 and "predates its record" in refused.stderr


def test_install_replaces_a_key_file_that_opens_this_store_alone(cli: Cli) -> None:
    ok(cli("init"))
    step_id = put(cli, 1)
    old = cli.key.read_bytes()
    report = as_json(cli("--json", "keys", "rotate-master", "--install"))
    assert report["installed"] == str(cli.key) and cli.key.read_bytes() != old
    assert key_file_use(cli.key).complete
    assert "hello" in ok(cli("read", "--owner", "bob", step_id)).stdout


@pytest.mark.sqlite_only
def test_rotation_advice_never_moves_a_key_over_an_existing_one(cli: Cli) -> None:
    env = {"PASS": "correct horse battery staple"}
    ok(cli("--db", "p.db", "--passphrase-env", "PASS", "init", env=env))
    ok(cli("init"))  # the default store and its key file
    result = ok(
        cli("--db", "p.db", "--passphrase-env", "PASS", "keys", "rotate-master", "--new-key-file", "n.key", env=env)
    )
    advice = " ".join(result.stderr.split())
    assert "mv " not in advice and "--key-file n.key" in advice
    assert ok(cli("--db", "p.db", "--key-file", "n.key", "stats"))
    ok(cli("stats"))  # the default store is untouched
    assert key_file_use(Path("n.key")).serves_only(
        json.loads(ok(cli("--json", "--db", "p.db", "--key-file", "n.key", "init")).stdout)["store_id"]
    )


def test_the_record_is_written_only_when_it_changes(tmp_path: Path) -> None:
    key = tmp_path / "key"
    first = record_key_file_use(key, "a", key_created=True)
    assert first.serves_only("a") and (first.record.stat().st_mode & 0o777) == 0o600
    mtime = first.record.stat().st_mtime_ns
    assert record_key_file_use(key, "a") == first and first.record.stat().st_mtime_ns == mtime
    both = record_key_file_use(key, "b")
    assert both.complete and both.stores == {"a", "b"} and not both.serves_only("a")
    first.record.write_text("not json")
    assert key_file_use(key).complete is False and key_file_use(key).stores == frozenset()


def test_install_keeps_the_old_key_when_a_forged_record_hides_another_store(cli: Cli, tmp_path: Path) -> None:
    """The record is a clear file: whoever writes the key directory can make it
    name this store alone. --install then replaces the shared key file, but
    the old key is kept beside it, so the other store still opens."""
    ok(cli("init"))
    other = str(tmp_path / "other.db")
    ok(cli("--db", other, "init"))  # the same key file
    other_id = as_json(cli("--json", "--db", other, "init"))["store_id"]
    step_id = put(cli, 1)
    this_id = as_json(cli("--json", "init"))["store_id"]
    old = cli.key.read_bytes()
    use = key_file_use(cli.key)
    use.record.write_text(json.dumps({"stores": [this_id], "complete": True}))  # the forgery
    report = as_json(cli("--json", "keys", "rotate-master", "--install"))
    kept = Path(report["old_key_kept"])
    assert kept == cli.key.with_name("key.replaced-1") and kept.read_bytes() == old
    assert (kept.stat().st_mode & 0o777) == 0o600
    assert "hello" in ok(cli("read", "--owner", "bob", step_id)).stdout  # the new key opens this store
    assert as_json(cli("--json", "--db", other, "--key-file", str(kept), "init"))["store_id"] == other_id
    assert other_id != this_id


def test_install_keeps_each_old_key_under_a_new_name(cli: Cli) -> None:
    ok(cli("init"))
    first = as_json(cli("--json", "keys", "rotate-master", "--install"))["old_key_kept"]
    second = as_json(cli("--json", "keys", "rotate-master", "--install"))["old_key_kept"]
    assert first != second and Path(first).read_bytes() != Path(second).read_bytes()
    ok(cli("stats"))


def test_a_failed_install_leaves_no_kept_key(cli: Cli, tmp_path: Path) -> None:
    ok(cli("init"))
    busy = cli.key.with_name("key.new")
    busy.mkdir()  # the new key cannot be made there: refused before anything changes
    refused = cli("keys", "rotate-master", "--install")
    assert refused.exit_code != 0 and "Traceback" not in refused.stderr
    assert not cli.key.with_name("key.replaced-1").exists()
    ok(cli("stats"))
