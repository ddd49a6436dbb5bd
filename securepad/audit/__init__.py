"""The isolation audit behind ``securepad audit``.

Two synthetic owners store canary entries in a real store and try everything
one tenant could try against another (every call, forged and malformed ids,
hostile principals, expiry, the policy's scope, the read cap); scratch copies
of the file are damaged as an attacker with write access would; the files are
scanned for the canaries' plaintext and, after gc, the expired entries'
ciphertext; and the deployment is checked. Each check is one row: name, pass
or fail, what was tried, what happened. Afterwards the audit owners are
forgotten and every real entry is compared, byte for byte, with its state before.

    with Scratchpad.open(path, keyring=keyring) as pad:
        report = run_audit(pad)
        assert report.passed, report.failed
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import PolicyError, SecurepadError
from ..policy import SCOPES, Policy, setting_sections
from ..store import Scratchpad, parts
from . import _api, _files, _postgres, _runtime
from ._support import OWNER_TABLES, CheckFailed, Context, Step, Steps, holding, scan_files, store_files

__all__ = ["Audit", "AuditReport", "CheckResult", "run_audit"]

# Observations are transient; a policy that keeps them longer than this
# defeats expiry as a way of keeping little.
MAX_SANE_TTL_SECONDS = 30 * 86_400
# What the comparison of owners' rows calls a row of each table.
_LABELS = {
    "owner_keys": "owner key",
    "entries": "entry",
    "checkpoints": "checkpoint",
    "compaction_marks": "compaction mark",
}


@dataclass(frozen=True)
class CheckResult:
    """One row of the audit: a check, whether it passed, what was tried, what happened."""

    name: str
    group: str
    passed: bool
    tried: str
    happened: str
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 4)}


@dataclass(frozen=True)
class AuditReport:
    """Every row of one audit run."""

    store: str
    policy: str
    key_source: str
    results: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        """True when there was at least one check and every check passed."""
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if not r.passed)

    def as_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "policy": self.policy,
            "key_source": self.key_source,
            "passed": self.passed,
            "checks": len(self.results),
            "failures": len(self.failed),
            "results": [r.as_dict() for r in self.results],
        }


@dataclass
class Audit:
    """One audit of an open store, run once: ``checks`` names every row in
    order, ``run()`` yields each row as it completes, ``report()`` gathers them.

    ``key_file`` defaults to the keyring's; scratch copies go to a private
    directory under ``scratch_dir``, by default beside the store.
    """

    pad: Scratchpad
    key_file: str | os.PathLike[str] | None = None
    scratch_dir: str | os.PathLike[str] | None = None
    _steps: list[Step] = field(default_factory=list, init=False)
    _results: list[CheckResult] = field(default_factory=list, init=False)
    _started: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self._steps = _plan(self.pad)

    @property
    def checks(self) -> tuple[str, ...]:
        """The name of every row, in the order ``run`` yields them."""
        return (*(s.name for s in self._steps), _REMOVED.name, _UNCHANGED.name)

    def run(self) -> Iterator[CheckResult]:
        """Run every check, yielding each result; then remove the audit tenants
        and compare the real entries with their state before.

        Raises:
            SecurepadError: the audit was already run.
        """
        if self._started:
            raise SecurepadError("an Audit runs once; make a new one")
        self._started = True
        pad = self.pad
        key_file = Path(self.key_file) if self.key_file is not None else pad.keyring.key_file
        scratch = Path(self.scratch_dir) if self.scratch_dir is not None else None
        ctx = Context(pad, key_file, scratch, _api.new_tenants())
        before = _real_state(ctx)
        try:
            for step in self._steps:
                yield self._record(_timed(step, ctx))
        finally:
            removed = _timed(_REMOVED, ctx)
        yield self._record(removed)
        after = _real_state(ctx)
        yield self._record(_timed(replace(_UNCHANGED, check=lambda c: _compare(before, after)), ctx))

    def _record(self, result: CheckResult) -> CheckResult:
        self._results.append(result)
        return result

    def report(self) -> AuditReport:
        """The rows so far (all of them once ``run`` is exhausted)."""
        pad = self.pad
        store = str(pad.path) if pad.backend == "sqlite" else str(pad.location)
        return AuditReport(store, pad.policy.name, repr(pad.keyring), tuple(self._results))


def run_audit(
    pad: Scratchpad,
    *,
    key_file: str | os.PathLike[str] | None = None,
    scratch_dir: str | os.PathLike[str] | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
) -> AuditReport:
    """Run the whole audit against ``pad`` and return its report; ``on_result``
    gets each row as it completes. A failed check is a row, not an exception.

    Raises:
        SecurepadError: the store cannot be used at all (closed, busy...).
    """
    audit = Audit(pad, key_file=key_file, scratch_dir=scratch_dir)
    for result in audit.run():
        if on_result is not None:
            on_result(result)
    return audit.report()


# -- the plan ------------------------------------------------------------------------


def _plan(pad: Scratchpad) -> list[Step]:
    """The audit's steps. PostgreSQL has no file to copy or scan: the server's
    roles, row-level security and grants instead, and rows tampered in place."""
    postgres = pad.backend != "sqlite"
    plan = [*(_postgres.DEPLOYMENT if postgres else _files.DEPLOYMENT), *_files.KEY_SOURCE, *_POLICY, *_api.SETUP]
    plan += [*(_postgres.RAW_QUERY if postgres else []), *_api.ISOLATION, *_runtime.RUNTIME]
    plan += _postgres.TAMPER if postgres else [*_files.TAMPER, *_files.AT_REST]
    return [replace(step, name=step.name.format(scope=pad.policy.scope)) for step in plan]


def _timed(step: Step, ctx: Context) -> CheckResult:
    """Run one check; its failure (or any error) becomes a failed row."""
    started = time.perf_counter()
    try:
        happened, passed = step.check(ctx), True
    except CheckFailed as exc:
        happened, passed = str(exc), False
    except Exception as exc:
        happened, passed = f"unexpected {type(exc).__name__}: {exc}", False
    return CheckResult(step.name, step.group, passed, step.tried, happened, time.perf_counter() - started)


# -- checks that belong to the run itself ----------------------------------------------

_POLICY = Steps("deployment")


@_POLICY("policy sane", "validate the policy again; log_denied on; bounded expiry")
def _policy_sane(ctx: Context) -> str:
    policy = ctx.pad.policy
    sections = setting_sections()
    values = policy.as_dict()
    nested: dict[str, dict[str, Any]] = {"access": {"scope": values["scope"]}}
    for key, section in sections.items():
        nested.setdefault(section, {})[key] = values[key]
    problems = []
    try:
        Policy.from_dict(nested, name=policy.name)
    except PolicyError as exc:
        problems.append(str(exc))
    if policy.scope not in SCOPES:
        problems.append(f"unknown scope {policy.scope!r}")
    if not policy.log_denied:
        problems.append("audit.log_denied is off: refused attempts leave no trace")
    if policy.max_ttl_seconds > MAX_SANE_TTL_SECONDS:
        problems.append(f"limits.max_ttl_seconds is {policy.max_ttl_seconds}, over 30 days")
    if problems:
        raise CheckFailed(f"policy {policy.name!r}: " + "; ".join(problems))
    return (
        f"policy {policy.name!r}: scope {policy.scope}, max_read_chars {policy.max_read_chars}, max_ttl_seconds"
        f" {policy.max_ttl_seconds}, log_denied on; every value within its bounds"
    )


def _remove_tenants(ctx: Context) -> str:
    pad, tenants = ctx.pad, ctx.synthetic
    postgres = pad.backend != "sqlite"
    ctx.remove_scratch()
    pieces: dict[str, bytes] = {}
    for label, entry_id in () if postgres else tenants.ids.items():
        pieces.update(_files.entry_ciphertext(ctx, entry_id, label))
    removed = [pad.forget_owner(owner) for owner in tenants.owners]
    tables = _postgres.owner_tables(ctx) if postgres else ("entries", "owner_keys")
    counts = " + ".join(f"(SELECT COUNT(*) FROM {table} WHERE owner_user_id IN (?, ?))" for table in tables)
    left = parts(pad).db.query(f"SELECT {counts} AS n", tenants.owners * len(tables), admin=True)[0]["n"]
    if left:
        raise CheckFailed(f"{left} rows of the audit owners remain")
    entries = sum(r.get("entries", 0) for r in removed)
    keys = sum(r.get("owner_keys", 0) for r in removed)
    deleted = f"{entries} entries and {keys} owner keys of {' and '.join(tenants.owners)} deleted"
    if postgres:
        left_in = ", ".join(tables)
        return f"{deleted}; no row of theirs is left in {left_in} (dead row versions go with the server's VACUUM)"
    if ctx.scratch_dir is not None:
        raise CheckFailed(f"the scratch directory {ctx.scratch_dir} remains")
    if still := holding(scan_files(store_files(pad.path), {**pieces, **tenants.canaries})):
        raise CheckFailed(f"after removal, found in the files: {still}")
    return (
        f"{deleted}; none of their {len(pieces)} ciphertext pieces or {len(tenants.canaries)} canaries is left"
        " in the files; the scratch copies are gone"
    )


def _real_state(ctx: Context) -> dict[str, str]:
    """A digest of every row of the owner tables not of the audit's owners
    (segments in their entry's), read in one snapshot."""
    pad, exclude = ctx.pad, ctx.synthetic.owners
    db = parts(pad).db
    tables = _postgres.owner_tables(ctx) if pad.backend != "sqlite" else OWNER_TABLES
    digests: dict[str, Any] = {}
    with db.snapshot():
        for table in tables:
            # Every column, those of later schemas too (the key's first).
            for row in db.query(f"SELECT * FROM {table} ORDER BY 1, 2", admin=True):
                if row.get("owner_user_id") in exclude:
                    continue
                text = repr(sorted(row.items())).encode()
                if table == "segments":
                    name = f"entry {row['entry_id']}"
                    if name not in digests:
                        if "owner_user_id" not in row:
                            continue  # SQLite's segments carry no owner: an audit entry's, or an orphan
                        digests[name] = hashlib.sha256(b"orphan segments")
                    digests[name].update(text)
                    continue
                key = row.get("id") or "/".join(str(row[c]) for c in ("owner_user_id", "turn_id") if c in row)
                sub = f" v{row['version']}" if table == "owner_keys" else ""
                digests[f"{_LABELS.get(table, table)} {key}{sub}"] = hashlib.sha256(text)
    return {name: digest.hexdigest() for name, digest in digests.items()}


def _compare(before: dict[str, str], after: dict[str, str]) -> str:
    missing = [name for name in before if name not in after]
    changed = [name for name in before if name in after and after[name] != before[name]]
    if missing or changed:
        raise CheckFailed(
            f"{len(missing)} missing ({', '.join(missing[:5])}), {len(changed)} changed ({', '.join(changed[:5])})"
            " (another process writing to the store during the audit would do this too)"
        )
    entries = sum(name.startswith("entry ") for name in before)
    keys = sum(name.startswith("owner key ") for name in before)
    records = len(before) - entries - keys
    new = len(set(after) - set(before))
    extra = f"; {new} written by others meanwhile were not compared" if new else ""
    return f"{entries} entries, {keys} owner keys and {records} turn records byte for byte as before the audit{extra}"


_REMOVED = Step(
    "audit tenants removed",
    "cleanup",
    "purge both audit owners (entries, keys), remove the scratch copies, scan the files again",
    _remove_tenants,
)
_UNCHANGED = Step(
    "real entries unchanged",
    "cleanup",
    "compare every other owner's entry rows, segments, owner keys and turn records with their state before",
    lambda ctx: "",
)
