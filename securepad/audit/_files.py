"""The audit's checks on files: deployment, what is at rest, and tampered copies.

Deployment checks read file modes and pragmas. The at-rest checks scan the
store's files (database, WAL, WAL index, journal) for the audit tenants'
plaintext canaries and, around gc, for their ciphertext. The tamper checks
damage SCRATCH COPIES of the store (``Context.tampered``), never the user's
file, and require every read of the damaged entry to end in IntegrityError
or NotFoundError.
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
from ..principal import Principal
from ..store import Scratchpad, sqlite_of
from . import drills
from ._support import CheckFailed, Context, expect_not_found, expect_refused, scan_files, store_files

__all__ = [
    "canary_scan",
    "entry_ciphertext",
    "gc_scrubs_expired",
    "key_file_permissions",
    "key_file_placement",
    "master_key_source",
    "no_key_file_left",
    "secure_delete_on",
    "store_dir_permissions",
    "store_file_permissions",
    "tamper_checks",
    "wrong_master_key",
]


# -- deployment ------------------------------------------------------------------------


def _require_posix() -> None:
    if os.name != "posix":
        raise CheckFailed("cannot check: POSIX permissions do not exist on this platform; check the ACLs by hand")


def _access_problems(path: Path, *, allow: int = 0) -> list[str]:
    """What is wrong with ``path``'s mode and owner: group/other bits beyond ``allow``, another owner."""
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    problems = []
    if mode & 0o077 & ~allow:
        problems.append(f"{path} is mode {mode:04o}: group or other users have access")
    if info.st_uid != os.getuid():
        problems.append(f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})")
    return problems


def store_file_permissions(ctx: Context) -> str:
    _require_posix()
    files = store_files(ctx.pad.path)
    problems = [p for path in files for p in _access_problems(path)]
    if problems:
        raise CheckFailed("; ".join(problems))
    modes = ", ".join(f"{p.name} {stat.S_IMODE(p.stat().st_mode):04o}" for p in files)
    return f"{modes}; all owned by this user"


def store_dir_permissions(ctx: Context) -> str:
    _require_posix()
    directory = ctx.pad.path.parent
    problems = _access_problems(directory)
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{directory} is mode {stat.S_IMODE(directory.stat().st_mode):04o}, owned by this user"


def _no_key_file(ctx: Context) -> str | None:
    if ctx.key_file is None:
        return f"no key file: the master key comes from {ctx.pad.keyring!r}"
    return None


def key_file_permissions(ctx: Context) -> str:
    if (none := _no_key_file(ctx)) is not None:
        return none
    assert ctx.key_file is not None
    _require_posix()
    if not ctx.key_file.is_file():
        raise CheckFailed(f"{ctx.key_file} is not a file")
    # The key's directory may be listable, but no one else may replace the key in it.
    problems = _access_problems(ctx.key_file) + _access_problems(ctx.key_file.parent, allow=0o055)
    if problems:
        raise CheckFailed("; ".join(problems))
    mode = stat.S_IMODE(ctx.key_file.stat().st_mode)
    return f"{ctx.key_file} is mode {mode:04o}, owned by this user, in a directory only this user can write"


def key_file_placement(ctx: Context) -> str:
    if (none := _no_key_file(ctx)) is not None:
        return none
    assert ctx.key_file is not None
    key = ctx.key_file.resolve()
    data_dir = ctx.pad.path.resolve().parent
    if key.is_relative_to(data_dir):
        raise CheckFailed(
            f"the key file {key} is inside the store's data dir {data_dir}: whoever copies or backs up"
            " the data dir gets the key with the ciphertext"
        )
    return f"the key file {key} is outside the store's data dir {data_dir}"


def master_key_source(ctx: Context) -> str:
    """Which master key opens the store; for a token or KMS, its key's attributes
    as the source reads them back (never extractable, sensitive) and that the URI holds no PIN."""
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


def no_key_file_left(ctx: Context) -> str:
    """A store whose master key is in a token or KMS: no key file that opened it
    lies around (it would open every copy of the store made before the move)."""
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
    """32-byte pieces of an entry's ciphertext as stored: each segment, the sealed
    metadata, the listing part and the wrapped item key. Random bytes: found in a file only if the
    entry is still there."""
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


def canary_scan(ctx: Context) -> str:
    """No canary in clear in any of the store's files, before and after a checkpoint."""
    tenants = ctx.tenants
    marker = "audit owner id (clear by design)"
    needles = {**tenants.canaries, marker: tenants.a.owner_user_id.encode()}
    reports = []
    for when in ("before", "after"):
        if when == "after":
            sqlite_of(ctx.pad).checkpoint()  # move the WAL's pages into the database file, then look again
        files = store_files(ctx.pad.path)
        found = scan_files(files, needles)
        if not found[marker]:
            raise CheckFailed(
                f"{when} a checkpoint the scan did not find the audit owner id, which is stored in clear:"
                " it is not reading the files that hold the entries"
            )
        leaked = {label: where for label, where in found.items() if where and label != marker}
        if leaked:
            raise CheckFailed(
                f"{when} a checkpoint, plaintext canaries found: "
                + "; ".join(f"{label} in {', '.join(where)}" for label, where in leaked.items())
            )
        reports.append(f"{when} a checkpoint: none in {', '.join(p.name for p in files)}")
    return (
        f"{len(tenants.canaries)} canaries ({', '.join(sorted(tenants.canaries))}) are in no file; "
        + "; ".join(reports)
        + "; the owner id, clear by design, was found, so the scan reads the right files"
    )


def gc_scrubs_expired(ctx: Context) -> str:
    """gc deletes the audit's expired entries and, with the scrub, their ciphertext leaves every file."""
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
    after = scan_files(files, pieces)
    left = {label: where for label, where in after.items() if where}
    if left:
        raise CheckFailed(
            "after gc, ciphertext of deleted entries is still in the files ("
            + "; ".join(f"{label} in {', '.join(where)}" for label, where in left.items())
            + "): secure_delete is off, or a reader kept the WAL from being checkpointed"
        )
    return (
        f"gc deleted {deleted} expired entries ({len(ids)} the audit's); {len(pieces)} pieces of their ciphertext,"
        f" found in {', '.join(holders)} before, are in none of {', '.join(p.name for p in files)} after the scrub"
    )


# -- tampered scratch copies -----------------------------------------------------------


def _segment_count(ctx: Context, entry_id: str) -> int:
    return int(sqlite_of(ctx.pad).query("SELECT segment_count AS n FROM entries WHERE id = ?", (entry_id,))[0]["n"])


def _flipped(ctx: Context) -> str:
    t = ctx.tenants
    text = t.ids["text"]
    last = _segment_count(ctx, text) - 1
    with ctx.tampered(lambda p: drills.flip_segment_byte(p, text, last)) as (copy, _):
        got = expect_refused("get after one flipped bit", copy.get, t.a, text)
        read = expect_refused("tail read after one flipped bit", copy.read, t.a, text, mode="tail", n=10)
    return f"one bit flipped in segment {last} of the text entry: get -> {got}, tail read -> {read}"


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


def _owner_key_swapped(ctx: Context) -> str:
    t = ctx.tenants
    owner_a, owner_b = t.owners
    with ctx.tampered(lambda p: drills.swap_owner_keys(p, owner_a, owner_b)) as (copy, _):
        a = expect_refused("owner a with b's owner key", copy.get, t.a, t.ids["text"])
        b = expect_refused("owner b with a's owner key", copy.get, t.b, t.ids["b_text"])
        listed = _list_refuses(copy, t.b, t.turn, t.ids["b_text"], "owner b lists with a's owner key")
    return f"the two owners' wrapped keys exchanged: a's get -> {a}, b's get -> {b}, b's list -> {listed}"


def _list_refuses(copy: Scratchpad, reader: Principal, turn: str, entry_id: str, what: str) -> str:
    """Listing must fail or leave the damaged entry out."""
    try:
        listed = copy.list_for_turn(reader, turn)
    except (IntegrityError, NotFoundError) as exc:
        return type(exc).__name__
    if any(item["scratchpad_id"] == entry_id for item in listed):
        raise CheckFailed(f"{what}: the damaged entry was listed")
    return "left out"


def _row_moved(ctx: Context) -> str:
    t = ctx.tenants
    text, binary = t.ids["text"], t.ids["binary"]
    owner_b = t.b.owner_user_id
    with ctx.tampered(lambda p: drills.move_entry_to_owner(p, text, owner_b)) as (copy, _):
        taken = expect_refused("b reads a's row relabelled as b's", copy.get, t.b, text)
        listed = _list_refuses(copy, t.b, t.turn, text, "b lists the turn holding it")
        expect_not_found(t.absent_message, "a asks for its relabelled row", copy.get, t.a, text)

    def with_key(path: Path) -> None:
        drills.move_entry_to_owner(path, binary, owner_b)
        drills.swap_owner_keys(path, *t.owners)

    with ctx.tampered(with_key) as (copy, _):
        keyed = expect_refused("b reads a row relabelled with a's owner key", copy.get, t.b, binary)
    return (
        f"a's row relabelled as owner b's: b's get -> {taken}, b's list -> {listed}, a's get -> NotFoundError;"
        f" relabelled and a's owner key put in b's place: {keyed}"
    )


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
        listed = _list_refuses(copy, t.b, t.turn, to_b, "b lists the copied row")
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


def tamper_checks() -> list[tuple[str, str, Callable[[Context], str]]]:
    """(name, what is tried, check) for every drill on a scratch copy."""
    return [
        ("tamper: flipped bit", "flip one bit of a segment in a scratch copy, read the entry", _flipped),
        (
            "tamper: segment moved",
            "replace a segment with another entry's, and with another owner's, in a scratch copy",
            _segment_moved,
        ),
        (
            "tamper: segments truncated or reordered",
            "drop the last segment (with and without fixing segment_count), swap two segments",
            _reordered_truncated,
        ),
        (
            "tamper: item key swapped",
            "copy the wrapped item key (and all key material) from another entry and another owner",
            _item_key_swapped,
        ),
        ("tamper: owner key swapped", "exchange the two audit owners' wrapped owner keys", _owner_key_swapped),
        (
            "tamper: row moved to another owner",
            "relabel owner a's row as owner b's (alone, and with a's owner key given to b)",
            _row_moved,
        ),
        (
            "tamper: row copied into another owner",
            "copy a's row and segments to owner b, and within a, under new ids",
            _row_copied,
        ),
        (
            "tamper: clear metadata edited",
            "edit each clear column of a row in turn (sizes, kind, turn, step, actor, channel, times,"
            " segment count, key version, nonce prefix, commitment, sealed metadata)",
            _metadata_edited,
        ),
    ]


def wrong_master_key(ctx: Context) -> str:
    path = ctx.drill_copy()
    wrong = Keyring.create_key_file(ctx.scratch() / "wrong.key")
    try:
        with Scratchpad.open(path, keyring=wrong, policy=ctx.pad.policy, anchor=False):
            pass
    except WrongKeyError as exc:
        return f"a fresh random master key is refused at open: WrongKeyError({exc})"
    raise CheckFailed("a scratch copy opened with a fresh random master key")
