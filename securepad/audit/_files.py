"""The audit's checks on files: deployment (modes, pragmas, the key's place),
what is at rest (the tenants' canaries, and their ciphertext around gc), and
tampered SCRATCH COPIES of the store, never the user's file, where every read
of the damaged entry must end in IntegrityError or NotFoundError.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import IntegrityError, NotFoundError, WrongKeyError
from ..keys.keyring import Keyring
from ..store import Scratchpad, sqlite_of
from . import drills
from ._support import CheckFailed, Context, Steps, Tenants, expect_refused, holding, scan_files, store_files

__all__ = ["AT_REST", "DEPLOYMENT", "KEY_SOURCE", "TAMPER", "entry_ciphertext"]

# KEY_SOURCE runs on both backends; the rest on SQLite.
DEPLOYMENT = Steps("deployment")
KEY_SOURCE = Steps("deployment")
AT_REST = Steps("at rest")
TAMPER = Steps("tamper")


# -- deployment ------------------------------------------------------------------------


def _require_access(*places: tuple[Path, int]) -> None:
    """Each path's mode gives group and other users no bits beyond its allowance, and this user owns it."""
    if os.name != "posix":
        raise CheckFailed("cannot check: POSIX permissions do not exist on this platform; check the ACLs by hand")
    problems = []
    for path, allow in places:
        info = path.stat()
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077 & ~allow:
            problems.append(f"{path} is mode {mode:04o}: group or other users have access")
        if info.st_uid != os.getuid():
            problems.append(f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})")
    if problems:
        raise CheckFailed("; ".join(problems))


@DEPLOYMENT("store file permissions", "mode and owner of the db, -wal, -shm files")
def store_file_permissions(ctx: Context) -> str:
    files = store_files(ctx.pad.path)
    _require_access(*((path, 0) for path in files))
    modes = ", ".join(f"{p.name} {stat.S_IMODE(p.stat().st_mode):04o}" for p in files)
    return f"{modes}; all owned by this user"


@DEPLOYMENT("store directory permissions", "mode and owner of the store's directory")
def store_dir_permissions(ctx: Context) -> str:
    directory = ctx.pad.path.parent
    _require_access((directory, 0))
    return f"{directory} is mode {stat.S_IMODE(directory.stat().st_mode):04o}, owned by this user"


def _no_key_file(ctx: Context) -> str:
    return f"no key file: the master key comes from {ctx.pad.keyring!r}"


@DEPLOYMENT("key file permissions", "mode and owner of the master key file and its directory")
def key_file_permissions(ctx: Context) -> str:
    key = ctx.key_file
    if key is None:
        return _no_key_file(ctx)
    if not key.is_file():
        raise CheckFailed(f"{key} is not a file")
    # The key's directory may be listable, but no one else may replace the key in it.
    _require_access((key, 0), (key.parent, 0o055))
    mode = stat.S_IMODE(key.stat().st_mode)
    return f"{key} is mode {mode:04o}, owned by this user, in a directory only this user can write"


@DEPLOYMENT("key file apart from the data", "whether the key file sits inside the store's data dir")
def key_file_placement(ctx: Context) -> str:
    if ctx.key_file is None:
        return _no_key_file(ctx)
    key = ctx.key_file.resolve()
    data_dir = ctx.pad.path.resolve().parent
    if key.is_relative_to(data_dir):
        raise CheckFailed(
            f"the key file {key} is inside the store's data dir {data_dir}: whoever copies or backs up"
            " the data dir gets the key with the ciphertext"
        )
    return f"the key file {key} is outside the store's data dir {data_dir}"


@KEY_SOURCE(
    "master key source",
    "which master key opens the store; a token's key read back: not extractable, sensitive; no PIN in the URI",
)
def master_key_source(ctx: Context) -> str:
    keyring = ctx.pad.keyring
    source = keyring.source
    if source is None:
        return f"the master key is in this process ({keyring.identifier}); --master-key-uri keeps it in a token or KMS"
    checks = source.inspect()
    failed = [check for check in checks if not check.ok]
    if failed:
        raise CheckFailed("; ".join(f"{check.name}: {check.detail}" for check in failed))
    return f"{keyring.identifier}: " + "; ".join(check.detail for check in checks)


def _recorded_stores(key_file: Path) -> frozenset[str]:
    """The store ids recorded beside ``key_file`` (``<key file>.stores``, written by
    the command line: cli/key_files.py); nothing when it is absent or unreadable."""
    try:
        stores = json.loads(key_file.with_name(key_file.name + ".stores").read_text("utf-8"))["stores"]
    except (OSError, ValueError, KeyError, TypeError):
        return frozenset()
    return frozenset(s for s in stores if isinstance(s, str)) if isinstance(stores, list) else frozenset()


@KEY_SOURCE(
    "no key file left for a token or KMS key",
    "whether a key file recorded to open this store lies in the key file's place",
)
def no_key_file_left(ctx: Context) -> str:
    """A key file that opened the store, left beside a token's or KMS's key, opens every copy made before the move."""
    keyring = ctx.pad.keyring
    if keyring.source is None:
        return f"the master key is {keyring.identifier}, not a token's or KMS's"
    candidates = {path for path in (ctx.key_file, Keyring.default_key_file()) if path is not None}
    left = sorted(str(path) for path in candidates if path.exists() and ctx.pad.store_id in _recorded_stores(path))
    if left:
        raise CheckFailed(
            f"{', '.join(left)} is recorded to open this store: it opens copies made before the master key"
            f" moved to {keyring.identifier}; delete it once no backup needs it and no other store uses it"
        )
    return f"no key file recorded for this store at {', '.join(sorted(map(str, candidates)))}"


@DEPLOYMENT("secure_delete on", "PRAGMA secure_delete and journal_mode on the store's connection")
def secure_delete_on(ctx: Context) -> str:
    conn = sqlite_of(ctx.pad).conn
    secure = conn.execute("PRAGMA secure_delete").fetchall()[0][0]
    journal = conn.execute("PRAGMA journal_mode").fetchall()[0][0]
    if secure != 1:
        raise CheckFailed(f"PRAGMA secure_delete is {secure}: deleted entries stay readable in free pages")
    if str(journal).lower() != "wal":
        raise CheckFailed(f"journal_mode is {journal}, not wal")
    return "PRAGMA secure_delete = 1 and journal_mode = wal on the store's connection"


# -- at rest ---------------------------------------------------------------------------


def entry_ciphertext(ctx: Context, entry_id: str, label: str) -> dict[str, bytes]:
    """32-byte pieces of an entry's ciphertext as stored (each segment, the
    sealed metadata, the listing part, the wrapped item key): random bytes, in
    a file only while the entry is."""
    pieces: dict[str, bytes] = {}
    rows = sqlite_of(ctx.pad).query(
        "SELECT sealed_meta, wrapped_key, only_segment, sealed_listing FROM entries WHERE id = ?", (entry_id,)
    )
    segments = sqlite_of(ctx.pad).query("SELECT seq, data FROM segments WHERE entry_id = ?", (entry_id,))
    for row in rows:
        pieces[f"{label} sealed metadata"] = bytes(row["sealed_meta"])[12:44]
        pieces[f"{label} wrapped item key"] = bytes(row["wrapped_key"])[12:44]
        if row["sealed_listing"] is not None:  # format byte and nonce, then ciphertext
            pieces[f"{label} listing part"] = bytes(row["sealed_listing"])[13:45]
        if row["only_segment"] is not None:  # a one-segment entry's segment, in its row
            segments = [*segments, {"seq": 0, "data": row["only_segment"]}]
    for row in segments:
        data = bytes(row["data"])
        middle = max(0, len(data) // 2 - 16)
        pieces[f"{label} segment {row['seq']}"] = data[middle : middle + 32]
    return {k: v for k, v in pieces.items() if len(v) == 32}


@AT_REST(
    "at-rest canary scan",
    "search the db, -wal, -shm and -journal files for every canary, before and after a checkpoint",
)
def canary_scan(ctx: Context) -> str:
    tenants = ctx.tenants
    marker = "audit owner id (clear by design)"
    needles = {**tenants.canaries, marker: tenants.a.owner_user_id.encode()}
    reports = []
    for when in ("before", "after"):
        if when == "after":
            sqlite_of(ctx.pad).checkpoint()  # move the WAL's pages into the database file, then look again
        files = store_files(ctx.pad.path)
        found = scan_files(files, needles)
        if not found.pop(marker):
            raise CheckFailed(
                f"{when} a checkpoint the scan did not find the audit owner id, which is stored in clear:"
                " it is not reading the files that hold the entries"
            )
        if leaked := holding(found):
            raise CheckFailed(f"{when} a checkpoint, plaintext canaries found: {leaked}")
        reports.append(f"{when} a checkpoint: none in {', '.join(p.name for p in files)}")
    return (
        f"{len(tenants.canaries)} canaries ({', '.join(sorted(tenants.canaries))}) are in no file; "
        + "; ".join(reports)
        + "; the owner id, clear by design, was found, so the scan reads the right files"
    )


@AT_REST("gc scrubs expired entries", "find the expired audit entry's ciphertext in the files, gc, search again")
def gc_scrubs_expired(ctx: Context) -> str:
    tenants, pad = ctx.tenants, ctx.pad
    pieces: dict[str, bytes] = {}
    for label in tenants.expired:
        pieces.update(entry_ciphertext(ctx, tenants.ids[label], label))
    if not pieces:
        raise CheckFailed("the expired audit entries were not in the store before gc")
    before = scan_files(store_files(pad.path), pieces)
    unseen = [label for label, where in before.items() if not where]
    if unseen:
        raise CheckFailed(f"before gc the scan did not find {', '.join(unseen)}: it would prove nothing")
    holders = sorted({name for where in before.values() for name in where})
    # The cutoff lies below every real entry's expiry: only the audit's own entries go.
    deleted = pad.gc(now=tenants.expired_cutoff)
    # gc rebuilds the file itself only when its deletes free a quarter of it; the
    # rebuild is what removes copies that b-tree rebalancing left in live pages.
    pad.scrub()
    ids = tuple(tenants.ids[label] for label in tenants.expired)
    marks = ", ".join("?" * len(ids))
    rows = sqlite_of(pad).query(f"SELECT COUNT(*) AS n FROM entries WHERE id IN ({marks})", ids)[0]["n"]
    segs = sqlite_of(pad).query(f"SELECT COUNT(*) AS n FROM segments WHERE entry_id IN ({marks})", ids)[0]["n"]
    if rows or segs:
        raise CheckFailed(f"gc left {rows} rows and {segs} segments of the expired audit entries")
    files = store_files(pad.path)
    if left := holding(scan_files(files, pieces)):
        raise CheckFailed(
            f"after gc, ciphertext of deleted entries is still in the files ({left}): secure_delete is off,"
            " or a reader kept the WAL from being checkpointed"
        )
    return (
        f"gc deleted {deleted} expired entries ({len(ids)} the audit's); {len(pieces)} pieces of their ciphertext,"
        f" found in {', '.join(holders)} before, are in none of {', '.join(p.name for p in files)} after the scrub"
    )


# -- tampered scratch copies -----------------------------------------------------------


def _segment_count(ctx: Context, entry_id: str) -> int:
    return int(sqlite_of(ctx.pad).query("SELECT segment_count AS n FROM entries WHERE id = ?", (entry_id,))[0]["n"])


@TAMPER("tamper: flipped bit", "flip one bit of a segment in a scratch copy, read the entry")
def _flipped(ctx: Context) -> str:
    t = ctx.tenants
    text = t.ids["text"]
    last = _segment_count(ctx, text) - 1
    with ctx.tampered(lambda p: drills.flip_segment_byte(p, text, last)) as (copy, _):
        got = expect_refused("get after one flipped bit", copy.get, t.a, text)
        read = expect_refused("tail read after one flipped bit", copy.read, t.a, text, mode="tail", n=10)
    return f"one bit flipped in segment {last} of the text entry: get -> {got}, tail read -> {read}"


@TAMPER(
    "tamper: segment moved",
    "replace a segment with another entry's, and with another owner's, in a scratch copy",
)
def _segment_moved(ctx: Context) -> str:
    t = ctx.tenants
    text, json_, binary, theirs = t.ids["text"], t.ids["json"], t.ids["binary"], t.ids["b_text"]
    edits = (
        lambda p: drills.copy_segment(p, json_, 0, text, 0),  # same owner, another entry
        lambda p: drills.copy_segment(p, theirs, 0, binary, 0),  # another owner's segment
    )
    with ctx.tampered(*edits) as (copy, _):
        same = expect_refused("segment from another entry", copy.get, t.a, text)
        other = expect_refused("segment from another owner", copy.get, t.a, binary)
    return f"segment 0 replaced by another entry's: {same}; by another owner's: {other}"


@TAMPER(
    "tamper: segments truncated or reordered",
    "drop the last segment (with and without fixing segment_count), swap two segments",
)
def _reordered_truncated(ctx: Context) -> str:
    t = ctx.tenants
    text, binary, json_ = t.ids["text"], t.ids["binary"], t.ids["json"]
    done = []
    edits: list[Callable[[Path], None]] = [
        lambda p: drills.drop_last_segment(p, binary),
        lambda p: drills.drop_last_segment(p, json_, fix_count=True),
    ]
    reorder = _segment_count(ctx, text) >= 2
    if reorder:
        edits.append(lambda p: drills.swap_segments(p, text, 0, 1))
    with ctx.tampered(*edits) as (copy, _):
        done.append(f"last segment dropped: {expect_refused('truncated entry', copy.get, t.a, binary)}")
        done.append(
            "last segment dropped and segment_count lowered to match: "
            + expect_refused("truncated entry with a matching count", copy.get, t.a, json_)
        )
        if reorder:
            done.append(f"segments 0 and 1 swapped: {expect_refused('reordered', copy.get, t.a, text)}")
        else:
            done.append("reordering not tried: the policy's limits leave the text entry one segment")
    return "; ".join(done)


@TAMPER(
    "tamper: item key swapped",
    "copy the wrapped item key (and all key material) from another entry and another owner",
)
def _item_key_swapped(ctx: Context) -> str:
    t = ctx.tenants
    text, json_, binary, theirs = t.ids["text"], t.ids["json"], t.ids["binary"], t.ids["b_text"]
    material = ("wrapped_key", "nonce_prefix", "commitment", "sealed_meta")
    edits = (
        lambda p: drills.copy_entry_columns(p, json_, text, ["wrapped_key"]),
        lambda p: drills.copy_entry_columns(p, theirs, binary, ["wrapped_key"]),
        lambda p: drills.copy_entry_columns(p, theirs, json_, material),
    )
    with ctx.tampered(*edits) as (copy, _):
        same = expect_refused("item key of another entry", copy.get, t.a, text)
        other = expect_refused("item key of another owner", copy.get, t.a, binary)
        whole = expect_refused("all key material of another owner's entry", copy.get, t.a, json_)
    return (
        f"wrapped item key from another entry: {same}; from another owner's entry: {other};"
        f" wrapped key, nonce prefix, commitment and sealed metadata of another owner's entry: {whole}"
    )


@TAMPER("tamper: owner key swapped", "exchange the two audit owners' wrapped owner keys")
def _owner_key_swapped(ctx: Context) -> str:
    t = ctx.tenants
    owner_a, owner_b = t.owners
    with ctx.tampered(lambda p: drills.swap_owner_keys(p, owner_a, owner_b)) as (copy, _):
        a = expect_refused("owner a with b's owner key", copy.get, t.a, t.ids["text"])
        b = expect_refused("owner b with a's owner key", copy.get, t.b, t.ids["b_text"])
        listed = _list_refuses(copy, t, t.ids["b_text"], "owner b lists with a's owner key")
    return f"the two owners' wrapped keys exchanged: a's get -> {a}, b's get -> {b}, b's list -> {listed}"


def _list_refuses(copy: Scratchpad, t: Tenants, entry_id: str, what: str) -> str:
    """b's listing of the turn must fail or leave the damaged entry out."""
    try:
        listed = copy.list_for_turn(t.b, t.turn)
    except (IntegrityError, NotFoundError) as exc:
        return type(exc).__name__
    if any(item["scratchpad_id"] == entry_id for item in listed):
        raise CheckFailed(f"{what}: the damaged entry was listed")
    return "left out"


@TAMPER(
    "tamper: row moved to another owner",
    "relabel owner a's row as owner b's (alone, and with a's owner key given to b)",
)
def _row_moved(ctx: Context) -> str:
    t = ctx.tenants
    text, binary = t.ids["text"], t.ids["binary"]
    owner_b = t.b.owner_user_id
    with ctx.tampered(lambda p: drills.move_entry_to_owner(p, text, owner_b)) as (copy, _):
        taken = expect_refused("b reads a's row relabelled as b's", copy.get, t.b, text)
        listed = _list_refuses(copy, t, text, "b lists the turn holding it")
        ctx.expect_not_found("a asks for its relabelled row", copy.get, t.a, text)

    def with_key(path: Path) -> None:
        drills.move_entry_to_owner(path, binary, owner_b)
        drills.swap_owner_keys(path, *t.owners)

    with ctx.tampered(with_key) as (copy, _):
        keyed = expect_refused("b reads a row relabelled with a's owner key", copy.get, t.b, binary)
    return (
        f"a's row relabelled as owner b's: b's get -> {taken}, b's list -> {listed}, a's get -> NotFoundError;"
        f" relabelled and a's owner key put in b's place: {keyed}"
    )


@TAMPER("tamper: row copied into another owner", "copy a's row and segments to owner b, and within a, under new ids")
def _row_copied(ctx: Context) -> str:
    t = ctx.tenants
    text, json_ = t.ids["text"], t.ids["json"]
    to_b, to_a = secrets.token_hex(8), secrets.token_hex(8)
    edits = (
        lambda p: drills.copy_entry(p, text, to_b, t.b.owner_user_id),
        lambda p: drills.copy_entry(p, json_, to_a, t.a.owner_user_id),
    )
    with ctx.tampered(*edits) as (copy, _):
        other = expect_refused("a's row copied into owner b", copy.get, t.b, to_b)
        listed = _list_refuses(copy, t, to_b, "b lists the copied row")
        same = expect_refused("a's row copied under a new id", copy.get, t.a, to_a)
    return (
        f"a's row and segments copied to owner b under a new id: get -> {other}, list -> {listed};"
        f" copied within owner a under a new id: {same}"
    )


def _tampered_values(row: dict[str, Any]) -> dict[str, object]:
    """For each clear column, a value an attacker might write instead."""

    def flipped(blob: bytes, at: int) -> bytes:
        data = bytearray(blob)
        data[at] ^= 0x01
        return bytes(data)

    return {
        "size_bytes": row["size_bytes"] + 1,
        "size_chars": row["size_chars"] + 1,
        "content_kind": "binary" if row["content_kind"] != "binary" else "text",
        "turn_id": row["turn_id"] + "-other",
        "step_num": row["step_num"] + 1,
        "executor_name": row["executor_name"] + "-other",
        "actor": row["actor"] + "-other",
        "channel": row["channel"] + "-other",
        "created_at": row["created_at"] - 1.0,
        "expires_at": row["expires_at"] + 86_400.0,
        "segment_count": row["segment_count"] + 1,
        "key_version": row["key_version"] + 1,
        "nonce_prefix": flipped(row["nonce_prefix"], 0),
        "commitment": flipped(row["commitment"], 0),
        "sealed_meta": flipped(row["sealed_meta"], len(row["sealed_meta"]) // 2),
        "sealed_listing": flipped(row["sealed_listing"], len(row["sealed_listing"]) // 2),
    }


@TAMPER(
    "tamper: clear metadata edited",
    "edit each clear column of a row in turn (sizes, kind, turn, step, actor, channel, times,"
    " segment count, key version, nonce prefix, commitment, sealed metadata)",
)
def _metadata_edited(ctx: Context) -> str:
    t = ctx.tenants
    text = t.ids["text"]
    outcomes: dict[str, list[str]] = {}
    with ctx.tampered() as (copy, path):
        row, _ = drills.entry_row(path, text)
        for column, value in _tampered_values(row).items():
            drills.set_column(path, text, column, value)
            outcome = expect_refused(f"{column} edited", copy.get, t.a, text)
            outcomes.setdefault(outcome, []).append(column)
            drills.set_column(path, text, column, row[column])
        # Control: with every column restored the entry opens, so the edits caused the refusals.
        if copy.get(t.a, text).observation != t.puts["text"]:
            raise CheckFailed("the restored entry no longer reads back as stored")
    return "; ".join(f"{', '.join(columns)} edited: {outcome}" for outcome, columns in sorted(outcomes.items())) + (
        "; restored, the entry reads back intact"
    )


@TAMPER("wrong master key", "open a scratch copy with a fresh random master key")
def wrong_master_key(ctx: Context) -> str:
    path = ctx.drill_copy()
    wrong = Keyring.create_key_file(ctx.scratch() / "wrong.key")
    try:
        with Scratchpad.open(path, keyring=wrong, policy=ctx.pad.policy, anchor=False):
            pass
    except WrongKeyError as exc:
        return f"a fresh random master key is refused at open: WrongKeyError({exc})"
    raise CheckFailed("a scratch copy opened with a fresh random master key")
