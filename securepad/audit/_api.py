"""The audit's checks through the library's API: what one principal can reach
of another's entries. Every refusal must be exactly the ``NotFoundError`` an
absent id gets, and every allowed access must return what was stored.
"""

from __future__ import annotations

import logging
import logging.handlers
import secrets
from collections.abc import Callable
from typing import Any, cast

from ..core import read_modes
from ..errors import ExpiredError, InvalidArgumentError, NotFoundError
from ..principal import Principal
from ..store import Scratchpad, parts
from ._support import CheckFailed, Context, Steps, Tenants, describe

__all__ = ["ISOLATION", "SETUP", "a_labels", "new_tenants", "read_args"]

# Per read mode, arguments that make it return something, and those that ask for as much as
# possible (for the read-cap check).
_READ_ARGS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "head": ({"n": 100}, {"n": 1 << 40}),
    "tail": ({"n": 100}, {"n": 1 << 40}),
    "range": ({"start": 10, "end": 200}, {"start": 0, "end": 1 << 40}),
    "full": ({}, {}),
    "lines": ({"start": 1, "end": 5}, {"start": 1, "end": 1 << 30}),
    "grep": ({"pattern": "audit"}, {"pattern": "0", "max_matches": 1 << 30}),
}
_SCOPE_FIELDS = {"owner": (), "owner+channel": ("channel",), "owner+channel+actor": ("channel", "actor")}
# Far enough ahead that every audit entry has expired.
_FAR_FUTURE = 4_102_444_800.0  # 2100-01-01
# The checks through the API, in order ("{scope}" in a name is the policy's scope).
SETUP = Steps("setup")
ISOLATION = Steps("isolation")


def read_args(mode: str, *, greedy: bool = False) -> dict[str, Any]:
    """Arguments for ``pad.read`` in ``mode``."""
    return dict(_READ_ARGS[mode][greedy])


def _visible(scope: str, reader: Principal, writer: Principal) -> bool:
    """The scope rule, written out independently of ``Policy.scope_columns``."""
    if reader.owner_user_id != writer.owner_user_id:
        return False
    return all(getattr(reader, f) == getattr(writer, f) for f in _SCOPE_FIELDS[scope])


# -- the tenants -----------------------------------------------------------------------


def new_tenants() -> Tenants:
    """Fresh synthetic principals; nothing is stored yet."""
    tag = secrets.token_hex(6)
    a = Principal(f"audit-{tag}-a", "audit-agent", "audit")
    return Tenants(
        tag=tag,
        a=a,
        a_channel=Principal(a.owner_user_id, a.actor, "audit-other-channel"),
        a_actor=Principal(a.owner_user_id, "audit-other-agent", a.channel),
        b=Principal(f"audit-{tag}-b", a.actor, a.channel),
        turn=f"audit-turn-{tag}",
    )


@SETUP("audit tenants", "store canary entries as two synthetic owners (three principals of a) and read them back")
def populate(ctx: Context) -> str:
    """Store the tenants' canary entries and read each back as its writer.

    The expired entry is put with ``now`` below every existing entry's expiry,
    so that ``gc(now=t.expired_cutoff)`` later deletes the audit's entries only.
    """
    pad, t = ctx.pad, ctx.synthetic
    policy = pad.policy
    budget = max(1, min(policy.max_entry_bytes, policy.owner_quota_bytes // 8))

    def canary(label: str) -> str:
        value = f"AUDITCANARY{secrets.token_hex(10)}"
        t.canaries[label] = value.encode()
        return value

    def text(label: str, target: int) -> str:
        mark = canary(label)
        line = f"000000 audit line {mark}\n"
        return "".join(f"{i:06d}{line[6:]}" for i in range(max(1, min(target, budget) // len(line))))

    def put(label: str, who: Principal, step: int, observation: Any, **kwargs: Any) -> None:
        view = pad.put(who, t.turn, step, "audit", observation, **kwargs)
        t.ids[label], t.puts[label], t.writers[label], t.steps[label] = view["scratchpad_id"], observation, who, step
        t.sizes[label] = int(view["size_bytes"])

    rows = parts(pad).db.query("SELECT MIN(expires_at) AS low FROM entries", admin=True)
    low = rows[0]["low"]
    base = 86_400.0 if low is None else min(86_400.0, float(low) - 10.0)
    t.expired_cutoff = base + 1.0

    meta_mark, scalar_mark = canary("metadata field"), canary("scalar field")
    content = text("text content", 150_000)
    put("text", t.a, 1, {"content": content, "metadata": {"path": f"/audit/{meta_mark}.log"}, "note": scalar_mark})
    bin_mark = canary("binary content").encode()
    size = max(2 * len(bin_mark), min(70_000, budget))
    put("binary", t.a, 2, bin_mark + secrets.token_bytes(size - 2 * len(bin_mark)) + bin_mark)
    json_mark = canary("json field")
    put("json", t.a, 3, {"items": [{"name": f"item {i}", "secret": json_mark} for i in range(20)], "total": 20})
    put("expired", t.a, 4, text("expired entry", 70_000), ttl_seconds=1, now=base)
    t.expired = ("expired",)
    put("a_channel", t.a_channel, 5, text("other channel", 2_000))
    put("a_actor", t.a_actor, 6, text("other actor", 2_000))
    put("b_text", t.b, 1, text("owner b content", 2_000))

    _read_back(pad, t)
    segments = parts(pad).db.query("SELECT segment_count AS n FROM entries WHERE id = ?", (t.ids["text"],), admin=True)
    ctx.ready = True
    return (
        f"{len(t.ids)} entries stored as {t.a.owner_user_id} (3 principals) and {t.b.owner_user_id}: text in"
        f" {segments[0]['n']} segments, binary, json, one already expired, and others' from another channel and actor;"
        f" each live one read back intact by its writer (get, and read in modes {', '.join(read_modes.MODES)})"
    )


def _read_back(pad: Scratchpad, t: Tenants) -> None:
    """Each live entry read back as stored by its writer (get, and every read mode); a random id refused."""
    try:
        pad.get(t.b, secrets.token_hex(8))
    except NotFoundError as exc:
        t.absent_message = str(exc)
    else:
        raise CheckFailed("a random id was served")

    for label in t.live():
        who, entry_id = t.writers[label], t.ids[label]
        if pad.get(who, entry_id).observation != t.puts[label]:
            raise CheckFailed(f"the {label} entry did not read back as stored")
        for mode in read_modes.MODES:
            try:
                result = pad.read(who, entry_id, mode=mode, **read_args(mode))
            except InvalidArgumentError:
                if label == "binary" and mode not in ("head", "tail", "range", "full"):
                    continue  # line-based modes need not apply to binary content
                raise
            if not result.get("ok"):
                raise CheckFailed(f"{mode} read of the {label} entry by its writer failed: {describe(result)}")


# -- owner boundary --------------------------------------------------------------------


def a_labels(t: Tenants) -> list[str]:
    return [label for label, who in t.writers.items() if who.owner_user_id == t.a.owner_user_id]


def _listed(pad: Scratchpad, reader: Principal, turn: str, **kwargs: Any) -> set[str]:
    return {item["scratchpad_id"] for item in pad.list_for_turn(reader, turn, **kwargs)}


def _refused_across(ctx: Context, verb: str, call: Callable[..., object], *, both: bool = True, **kwargs: Any) -> int:
    """b ``verb`` each of a's ids (and with ``both`` a b's) with ``call``: NotFoundError each time.
    Returns how many of a's ids were tried."""
    t = ctx.tenants
    labels = a_labels(t)
    for label in labels:
        ctx.expect_not_found(f"b {verb} a's {label} entry", call, t.b, t.ids[label], **kwargs)
    if both:
        ctx.expect_not_found(f"a {verb} b's entry", call, t.a, t.ids["b_text"], **kwargs)
    return len(labels)


@ISOLATION("cross-owner get", "owner b asks for each of owner a's ids, and a for b's")
def _cross_get(ctx: Context) -> str:
    count = _refused_across(ctx, "gets", ctx.pad.get)
    return (
        f"b asked for each of a's {count} ids (live, expired, other channel and actor) and a for b's:"
        f" NotFoundError({ctx.tenants.absent_message!r}) every time, as for an absent id"
    )


def _cross_read(mode: str) -> None:
    @ISOLATION(f"cross-owner read: {mode}", f"b reads each of a's ids with mode={mode}, and a reads b's")
    def check(ctx: Context) -> str:
        args = read_args(mode)
        count = _refused_across(ctx, "reads", ctx.pad.read, mode=mode, **args)
        return f"read(mode={mode!r}, {args}) of a's {count} ids as b, and of b's as a: NotFoundError each time"


for _mode in read_modes.MODES:
    _cross_read(_mode)


@ISOLATION("cross-owner list", "a and b list the same turn id; b lists after expiry")
def _cross_list(ctx: Context) -> str:
    t, pad = ctx.tenants, ctx.pad
    listed = _listed(pad, t.b, t.turn)
    if listed != {t.ids["b_text"]}:
        raise CheckFailed(f"b's list of the shared turn id holds {sorted(listed)}, not just b's own entry")
    if t.ids["b_text"] in _listed(pad, t.a, t.turn):
        raise CheckFailed("a's list of the shared turn id holds b's entry")
    if later := pad.list_for_turn(t.b, t.turn, now=_FAR_FUTURE):
        raise CheckFailed(f"b's list after every entry expired holds {describe(later)}")
    return "a and b used the same turn id: b's list holds only b's entry, a's never b's; after expiry b's is empty"


def _expected_stats(pad: Scratchpad, t: Tenants, reader: Principal) -> tuple[int, int]:
    labels = [label for label in t.live() if _visible(pad.policy.scope, reader, t.writers[label])]
    return len(labels), sum(t.sizes[label] for label in labels)


@ISOLATION("cross-owner stats", "a and b ask for their stats")
def _cross_stats(ctx: Context) -> str:
    t, pad = ctx.tenants, ctx.pad
    told = []
    for name, reader in (("a", t.a), ("b", t.b)):
        stats = pad.stats(reader)
        want = _expected_stats(pad, t, reader)
        if (stats["entries"], stats["bytes"]) != want:
            raise CheckFailed(
                f"{name}'s stats count {stats['entries']} entries, {stats['bytes']} bytes; expected {want}"
            )
        told.append(f"{name}: {want[0]} entries, {want[1]} bytes")
    return "each owner's stats count only what its scope allows (" + "; ".join(told) + ")"


@ISOLATION("cross-owner delete", "b deletes each of a's ids")
def _cross_delete(ctx: Context) -> str:
    t, pad = ctx.tenants, ctx.pad
    count = _refused_across(ctx, "deletes", pad.delete, both=False)
    if pad.get(t.a, t.ids["text"]).observation != t.puts["text"]:
        raise CheckFailed("a's entry changed after b's delete attempts")
    return f"b tried to delete each of a's {count} ids: NotFoundError each time; a's entries are intact"


# -- ids -------------------------------------------------------------------------------


def _forged_variants(entry_id: str) -> list[str]:
    swap = {c: format((int(c, 16) + 1) % 16, "x") for c in "0123456789abcdef"}
    fullwidth = entry_id.translate({ord(c): ord(c) + 0xFEE0 for c in "0123456789abcdef"})
    variants = [entry_id[:i] + swap[entry_id[i]] + entry_id[i + 1 :] for i in (0, 7, 15)]
    variants += [entry_id.upper(), entry_id[:-1], entry_id + "0", " " + entry_id, entry_id + "\n", fullwidth]
    return [v for v in variants if v != entry_id]


@ISOLATION("forged ids", "near-misses of a's ids, as a and as b")
def _forged(ctx: Context) -> str:
    t, pad = ctx.tenants, ctx.pad
    tried = 0
    for label in t.live(t.a.owner_user_id):
        for forged in _forged_variants(t.ids[label]):
            for reader in (t.a, t.b):
                ctx.expect_not_found(f"forged id {forged!r}", pad.get, reader, forged)
                ctx.expect_not_found(f"forged id {forged!r}", pad.read, reader, forged, mode="head")
                tried += 1
    return (
        f"{tried} near-misses of a's ids (one hex digit changed, upper case, cut, extended, padded, fullwidth"
        " digits), asked for by a itself and by b: NotFoundError each time"
    )


@ISOLATION("guessed ids", "random well-formed ids, as b")
def _guessed(ctx: Context) -> str:
    t, pad = ctx.tenants, ctx.pad
    count = 256
    for _ in range(count):
        guess = secrets.token_hex(8)
        ctx.expect_not_found(f"guessed id {guess}", pad.get, t.b, guess)
    return f"{count} random well-formed ids asked for by b: NotFoundError each time"


def _malformed_ids(some_id: str) -> list[object]:
    sql = ["' OR '1'='1", "' OR 1=1 --", f"{some_id}' OR '1'='1", f"{some_id}'--", "1; DROP TABLE entries; --"]
    wildcards = ["%", "_" * 16, "*", "?", "NULL"]
    nul = ["\x00", "\x00" * 16, some_id + "\x00", "\x00" + some_id, some_id[:8] + "\x00" + some_id[8:]]
    # Arabic-Indic digits (\d matches them, [0-9] must not), a bidi mark, lone surrogates (not even valid UTF-8).
    unicode = ["é" * 16, "\u0660" * 16, "\u202e" + some_id, "\U0001f511" * 16, "\ud800" * 16]
    others = [None, 0, int(some_id, 16), some_id.encode(), [some_id], {"id": some_id}]
    return ["", " ", "x" * (1 << 20), *sql, *wildcards, *nul, *unicode, *others]


@ISOLATION("malformed ids", "empty, huge, SQL, NUL, unicode and non-string ids to get/read/delete")
def _malformed(ctx: Context) -> str:
    t, pad = ctx.tenants, ctx.pad
    values = _malformed_ids(t.ids["text"])
    for value in values:
        bad = cast(str, value)
        what = f"malformed id {describe(value)[:40]}"
        for reader in (t.a, t.b):
            ctx.expect_not_found(what, pad.get, reader, bad)
            ctx.expect_not_found(what, pad.read, reader, bad, mode="full")
            ctx.expect_not_found(what, pad.delete, reader, bad)
    if pad.get(t.a, t.ids["text"]).observation != t.puts["text"]:
        raise CheckFailed("a's entry changed after the malformed ids")
    return (
        f"{len(values)} malformed ids (empty, 1 MiB, SQL fragments, wildcards, NUL bytes, unicode digits,"
        " bidi marks, lone surrogates, None, ints, bytes, lists, dicts) to get, read and delete as a and b:"
        " NotFoundError each time; the store is unchanged"
    )


@ISOLATION(
    "hostile principals and turn ids", "principals and turn ids made of SQL fragments, wildcards and look-alikes"
)
def _hostile(ctx: Context) -> str:
    t, pad = ctx.tenants, ctx.pad
    owner = t.a.owner_user_id
    readers = [
        Principal(f"{owner}' OR '1'='1", t.a.actor, t.a.channel),
        Principal(f"{owner}' --", t.a.actor, t.a.channel),
        Principal(f"audit-{t.tag}-%", "%", "%"),
        Principal(owner.upper(), t.a.actor, t.a.channel),
        Principal(owner + " ", t.a.actor, t.a.channel),
        Principal(owner[:-1] + "\u0430", t.a.actor, t.a.channel),  # Cyrillic a: a look-alike owner
        Principal(owner, "' OR '1'='1", "' OR ''='"),
        Principal(owner, "%", "*"),
    ]
    scope = pad.policy.scope
    for reader in readers:
        want = {t.ids[label] for label in t.live() if _visible(scope, reader, t.writers[label])}
        if (listed := _listed(pad, reader, t.turn)) != want:
            raise CheckFailed(f"{reader} lists {sorted(listed)}; its scope allows {sorted(want)}")
        if pad.stats(reader)["entries"] != len(want):
            raise CheckFailed(f"{reader}'s stats count entries outside its scope")
        for label in t.live():
            if t.ids[label] not in want:
                ctx.expect_not_found(f"{reader} gets {label}", pad.get, reader, t.ids[label])
    turns = [f"{t.turn}' OR '1'='1", f"{t.turn}' --", "%", f"{t.turn[:-2]}%", "*", t.turn.upper(), t.turn + " "]
    refused = ["", t.turn + "\x00", "x" * 5000, "\ud800"]
    for turn in turns + refused:
        try:
            listed_any = pad.list_for_turn(t.a, turn)
        except InvalidArgumentError:
            if turn in turns:
                raise CheckFailed(f"turn id {turn!r} was refused as invalid; it is a valid id of no turn") from None
            continue
        if listed_any:
            raise CheckFailed(f"turn id {turn!r} listed {len(listed_any)} entries")
    return (
        f"{len(readers)} principals with SQL fragments, wildcards, case and look-alike variants of a's"
        f" owner id see exactly what the scope '{scope}' allows; {len(turns) + len(refused)} hostile turn ids"
        " list nothing (or are refused as invalid)"
    )


# -- expiry ----------------------------------------------------------------------------


@ISOLATION("expired entries: others", "principals outside a's scope ask for a's expired entry")
def _expired_other(ctx: Context) -> str:
    t, pad = ctx.tenants, ctx.pad
    expired = t.ids["expired"]
    outsiders = [r for r in (t.b, t.a_channel, t.a_actor) if not _visible(pad.policy.scope, r, t.a)]
    for reader in outsiders:
        ctx.expect_not_found("an outsider gets a's expired entry", pad.get, reader, expired)
        for mode in read_modes.MODES:
            what = f"an outsider reads a's expired entry ({mode})"
            ctx.expect_not_found(what, pad.read, reader, expired, mode=mode, **read_args(mode))
        ctx.expect_not_found("after expiry, an outsider", pad.get, reader, t.ids["text"], now=_FAR_FUTURE)
    return (
        f"{len(outsiders)} principal(s) outside a's scope asked for a's expired entry (get, every read mode) and for"
        " a live one at a later now=: plain NotFoundError, never ExpiredError, which would tell the id exists"
    )


def _expect_expired(call: Callable[[], object], what: str) -> None:
    try:
        result = call()
    except ExpiredError:
        return
    except NotFoundError as exc:
        raise CheckFailed(f"{what}: {type(exc).__name__}({exc}) instead of ExpiredError") from None
    raise CheckFailed(f"{what}: served {describe(result)}")


@ISOLATION("expired entries: owner", "a asks for its expired entry; reads at the expiry instant (now=)")
def _expired_owner(ctx: Context) -> str:
    t, pad = ctx.tenants, ctx.pad
    expired = t.ids["expired"]
    _expect_expired(lambda: pad.get(t.a, expired), "a gets its expired entry")
    _expect_expired(lambda: pad.read(t.a, expired, mode="full"), "a reads its expired entry")
    if expired in _listed(pad, t.a, t.turn):
        raise CheckFailed("a's list holds its expired entry")
    text = t.ids["text"]
    expires = pad.get(t.a, text).expires_at
    if pad.read(t.a, text, mode="head", n=10, now=expires - 0.5)["metadata"]["size_returned"] != 10:
        raise CheckFailed("the entry was not served just before it expires")
    _expect_expired(lambda: pad.get(t.a, text, now=expires), "a gets its entry at its expiry instant")
    _expect_expired(lambda: pad.read(t.a, text, mode="head", now=expires), "a reads its entry at its expiry instant")
    if text in _listed(pad, t.a, t.turn, now=expires):
        raise CheckFailed("a's list at the expiry instant holds the expired entry")
    stats = pad.stats(t.a, now=expires)
    if stats["entries"] >= _expected_stats(pad, t, t.a)[0]:
        raise CheckFailed("a's stats at the expiry instant still count the expired entry")
    return (
        "a's own expired entry: ExpiredError on get and read, left out of list and stats; a live entry is served"
        " 0.5 s before expires_at and refused from that instant on (now= given)"
    )


# -- scope, cap, log -------------------------------------------------------------------


@ISOLATION("policy scope: {scope}", "owner a from its own, another channel and another actor: get, read, list, stats")
def _scope(ctx: Context) -> str:
    t, pad = ctx.tenants, ctx.pad
    scope = pad.policy.scope
    seen = []
    for name, reader in (("a", t.a), ("a on another channel", t.a_channel), ("a as another actor", t.a_actor)):
        want = {label for label in t.live() if _visible(scope, reader, t.writers[label])}
        for label in t.live():
            entry_id = t.ids[label]
            if label in want:
                if pad.get(reader, entry_id).observation != t.puts[label]:
                    raise CheckFailed(f"{name} got the {label} entry altered")
                if not pad.read(reader, entry_id, mode="head", n=10)["ok"]:
                    raise CheckFailed(f"{name} could not read the {label} entry its scope allows")
            else:
                ctx.expect_not_found(f"{name} gets {label}", pad.get, reader, entry_id)
                ctx.expect_not_found(f"{name} reads {label}", pad.read, reader, entry_id, mode="head")
        if (listed := _listed(pad, reader, t.turn)) != {t.ids[label] for label in want}:
            raise CheckFailed(f"{name} lists {len(listed)} entries; its scope allows {len(want)}")
        if (pad.stats(reader)["entries"], pad.stats(reader)["bytes"]) != _expected_stats(pad, t, reader):
            raise CheckFailed(f"{name}'s stats do not match its scope")
        seen.append(f"{name} sees {len(want)}")
    return f"scope '{scope}': " + ", ".join(seen) + " of the live entries; get, read, list and stats agree"


def _returned_chars(value: object) -> int:
    """Characters of content a read returned (strings inside lists and dicts summed)."""
    if isinstance(value, str):
        return len(value)
    inner = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return sum(map(_returned_chars, inner))


@ISOLATION("full-read cap", "every read mode asks for more than max_read_chars, text and binary")
def _full_cap(ctx: Context) -> str:
    t, pad = ctx.tenants, ctx.pad
    policy = pad.policy
    cap = policy.max_read_chars
    used = sum(t.sizes[label] for label in t.live(t.a.owner_user_id)) + t.sizes["expired"]
    room = min(policy.max_entry_bytes, policy.owner_quota_bytes - used)
    told = []
    for kind, need in (("text", cap + 100), ("binary", cap // 4 * 3 + 100)):
        if need > room:
            told.append(f"no {kind} entry can exceed the cap (max_entry_bytes and quota allow {room} bytes)")
            continue
        observation: str | bytes = (
            "".join(f"{i:07d}\n" for i in range(need // 8 + 1))[:need] if kind == "text" else b"\x00" * need
        )
        entry_id = pad.put(t.a, t.turn, 90, "audit-cap", observation)["scratchpad_id"]
        try:
            for mode in read_modes.MODES:
                try:
                    result = pad.read(t.a, entry_id, mode=mode, **read_args(mode, greedy=True))
                except InvalidArgumentError:
                    continue  # refusing an oversized request returns nothing, which is within the cap
                got = _returned_chars(result.get("content"))
                if got > cap:
                    raise CheckFailed(f"a {mode} read of a {need}-unit {kind} entry returned {got} > {cap} characters")
                if mode == "full" and not (result["metadata"].get("truncated") and result["metadata"].get("capped")):
                    raise CheckFailed(f"a capped full read of a {kind} entry does not say truncated and capped")
        finally:
            pad.delete(t.a, entry_id)
        told.append(f"{kind} entry of {need} {'bytes' if kind == 'binary' else 'characters'}: every mode at most {cap}")
    return f"max_read_chars = {cap}; " + "; ".join(told) + "; a full read says truncated and capped"


@ISOLATION("denied attempts logged", "b's refused get, watched on the 'securepad.audit' logger")
def _denied_logged(ctx: Context) -> str:
    t, pad = ctx.tenants, ctx.pad
    if not pad.policy.log_denied:
        return "not applicable: the policy turns log_denied off (see 'policy sane')"
    logger = logging.getLogger("securepad.audit")
    if not logger.isEnabledFor(logging.WARNING):
        raise CheckFailed("the 'securepad.audit' logger drops warnings: denied attempts are not recorded")
    handler = logging.handlers.BufferingHandler(capacity=1 << 16)
    handler.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        ctx.expect_not_found("b gets a's entry", pad.get, t.b, t.ids["text"])
    finally:
        logger.removeHandler(handler)
    mine = [r for r in handler.buffer if t.b.owner_user_id in r.getMessage()]
    if not mine:
        raise CheckFailed("b's refused attempt left no record in the 'securepad.audit' log")
    return f"b's refused attempt was logged: {mine[0].getMessage()[:100]}"
