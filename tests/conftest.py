"""Shared fixtures: a real store (AES-GCM over apsw, and over PostgreSQL when a
server is reachable) in a temporary directory or a throwaway database.

The ``pad`` fixture runs each test on both backends (ids ``[sqlite]`` and
``[postgresql]``), except tests that also take ``db_path`` (they work on the
file) or are marked ``sqlite_only``. The PostgreSQL runs use one database per
test session (per pytest-xdist worker), created under a unique name and
dropped at the end. Without a server they are skipped, saying why; with
``CI=true`` a missing server is an error.

A PostgreSQL ``pad`` is a store no earlier test touched. Making one (the whole
migration list) costs far more than a short test, so each test process keeps
the store it made last (``tests.support.pristine.PristineStore``) and lends it
to its next ``pad`` test, with the same master key (``key_file`` writes the
kept key's file before ``keyring`` reads it), only when it proves pristine
after the test:

- the ``securepad`` schema's catalog (tables, columns, indexes, constraints,
  triggers, row-level security policies and flags, functions' source and
  settings, owners, grants, sequences) has the digest taken right after the
  store was made;
- then every owner's table written to is truncated and the master key's wrap
  count set back: the store's identity rows (``store_meta``) and
  ``schema_version`` stay as they are;
- then every table's rows, every relation's size and planner figures, and the
  absence of column statistics have the digest taken when it was made.

Any difference or error drops the schema, and the next test makes a new store.
A test that takes ``pg_dsn`` without ``pad`` gets a database with no store
schema (a kept one is dropped first), and its schema is dropped afterwards.
The product keeps no cache across stores: each test opens its own
``Scratchpad`` and connections, and the module-level caches
(``functools.lru_cache`` in ``storage.postgres``) hold statement texts and
lock keys, pure functions of their arguments.
"""

from __future__ import annotations

import gc
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from hypothesis import HealthCheck, settings

from securepad import Keyring, Principal, Scratchpad
from tests.support.bytecode import share_bytecode
from tests.support.collected_frameworks import FRAMEWORKS_AT_COLLECTION, imported_frameworks
from tests.support.moto_kms import AWS_VARIABLES, SECUREPAD_ACTIONS, MotoKms, start_moto
from tests.support.principals import ALICE, BOB
from tests.support.pristine import PristineStore
from tests.support.scheduling import GROUPS_INPUT, GroupedLoadScheduling, groups_file, write_groups
from tests.support.softhsm import SoftHsm, find_softhsm
from tests.support.sources import master_key_uri  # noqa: F401 - a fixture: a fresh key's URI on each source

# pytest-xdist's workers start with COLUMNS set; rich would fix the command
# line's width at import from it. Each test that depends on the width says it.
os.environ.pop("COLUMNS", None)

# The tests' scratch files (``tmp_path``, and the temporary files of the processes
# they start) live in memory where the machine has /dev/shm: each new store fsyncs
# its key, anchor and database files, which on a disk costs several times the
# store's CPU, and no test depends on the file system behind them. A TMPDIR (or
# ``--basetemp``) set by whoever runs the tests is kept.
if "TMPDIR" not in os.environ and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):
    os.environ["TMPDIR"] = "/dev/shm"
    tempfile.tempdir = None  # read TMPDIR again


@pytest.fixture(scope="session", autouse=True)
def _children_bytecode(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The processes the tests start share one bytecode cache for the run
    (``tests.support.bytecode``), where bytecode is not written; the test
    processes themselves keep their own setting."""
    if not sys.dont_write_bytecode or "PYTHONPYCACHEPREFIX" in os.environ:
        return
    basetemp = tmp_path_factory.getbasetemp()
    run = basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp  # shared by the workers
    share_bytecode(run / "pycache")


settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.register_profile(
    "dev", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.load_profile("ci")


def stable_repr(value: object) -> str:
    """A parametrized test's id from ``repr`` without memory addresses, so that
    every pytest-xdist worker collects the same ids."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


@pytest.fixture
def key_file(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """Where ``keyring``'s key file is: absent, or the kept store's key when
    the test's ``pad`` is the kept PostgreSQL store (``_lends_kept``)."""
    path = tmp_path / "config" / "key"
    if _lends_kept(request):
        request.getfixturevalue("_pristine").place_key(path)
    return path


@pytest.fixture
def keyring(key_file: Path) -> Keyring:
    return Keyring.from_key_file(key_file)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "store.db"


# The server the PostgreSQL tests use: a role that may create databases and roles.
PG_SERVER_DSN = os.environ.get("SECUREPAD_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = ("sqlite", "postgresql")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only: the test works on the SQLite file itself")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: a worker more than the cores. The slow tests wait (on the
    server, on a child process, on a deadline) as much as they compute, and
    the extra worker keeps the cores busy meanwhile; a second one costs more
    than it gains (the workers then slow one another). Without the slow tests
    (``-m "not slow"``), one worker per core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores if "not slow" in (config.getoption("markexpr") or "") else cores + 1


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    file_bound = "db_path" in metafunc.fixturenames or metafunc.definition.get_closest_marker("sqlite_only")
    # The PostgreSQL runs (a server round trip per statement) are left out of ``-m "not slow"``.
    backends = [pytest.param(b, marks=pytest.mark.slow) if b == "postgresql" else b for b in BACKENDS]
    metafunc.parametrize("backend", ("sqlite",) if file_bound else backends)


def _long(item: pytest.Item) -> bool:
    """Whether a test is marked slow on its function or module (a long test), not
    only as a PostgreSQL run."""
    marks = list(item.iter_markers(name="slow"))
    as_a_run = [mark for mark in getattr(getattr(item, "callspec", None), "marks", []) if mark.name == "slow"]
    return len(marks) > len(as_a_run)


# The fixtures through which a test reaches the PostgreSQL server, or the KMS
# emulator (moto's server: a worker starts its own, seconds of CPU).
_SERVER_FIXTURES = frozenset({"pg_database", "pg_dsn", "moto_kms"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that reaches the PostgreSQL server or the KMS emulator is a
    server run, left out of ``-m "not slow"`` like the ``[postgresql]`` runs
    of ``pad``, and so is every test of an agent framework (its
    ``xdist_group``: importing the framework costs seconds). Then the order
    (otherwise the collection's): the long tests first, then the server runs
    (a server's round trips, a child process), then the rest. pytest-xdist
    deals the first tests out one by one and the rest in chunks as the workers
    ask: the long ones spread over the workers, and the short local tests fill
    the end, instead of one worker finishing a chunk of server runs while the
    others idle."""
    long = {item.nodeid for item in items if _long(item)}
    for item in items:
        if _SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())) or item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: 0 if item.nodeid in long else 1 if item.get_closest_marker("slow") else 2)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Which frameworks collecting imported (``tests/test_collection.py`` wants none);
    what collecting made is frozen out of the garbage collector's passes; in a
    pytest-xdist worker, the groups of the tests (``tests.support.scheduling``)."""
    session.config.stash[FRAMEWORKS_AT_COLLECTION] = imported_frameworks()
    # What collecting made (modules, test items) lives until the end: the
    # collector's full passes during the tests need not walk it again.
    gc.collect()
    gc.freeze()
    path = groups_file(session.config)
    if path is not None:
        write_groups(path, session.items)


# Where the workers write their tests' groups (made by the controller when it starts the first).
_GROUPS = pytest.StashKey[Path]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell each pytest-xdist worker where to write its tests' groups."""
    stash = node.config.stash
    if _GROUPS not in stash:
        stash[_GROUPS] = Path(tempfile.mkdtemp(prefix="securepad-test-groups-")) / "groups.json"
    node.workerinput[GROUPS_INPUT] = str(stash[_GROUPS])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist load`` (the default of ``-n``) keeps each ``xdist_group`` on one worker."""
    if config.getvalue("dist") != "load" or _GROUPS not in config.stash:
        return None
    return GroupedLoadScheduling(config, log, config.stash[_GROUPS])


def pytest_unconfigure(config: pytest.Config) -> None:
    if _GROUPS in config.stash:
        shutil.rmtree(config.stash[_GROUPS].parent, ignore_errors=True)


def _server_dsn(dbname: str) -> str:
    """PG_SERVER_DSN (a postgresql:// URL) with another database."""
    return urlunsplit(urlsplit(PG_SERVER_DSN)._replace(path=f"/{dbname}"))


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A database of its own for this test session (dropped afterwards); its DSN."""
    try:
        import psycopg

        server = psycopg.connect(PG_SERVER_DSN, autocommit=True, connect_timeout=3)
    except Exception as exc:  # ImportError, or any connection failure
        reason = f"PostgreSQL tests need a server at {PG_SERVER_DSN} (SECUREPAD_TEST_PG_DSN): {exc}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    name = f"securepad_test_{secrets.token_hex(6)}"
    with server:
        server.execute(f"CREATE DATABASE {name}")
        try:
            yield _server_dsn(name)
        finally:
            server.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def softhsm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoftHsm]:
    """SoftHSM2 tokens of this test process's own (``SOFTHSM2_CONF`` set for the session)."""
    found = find_softhsm()
    if found is None:
        reason = "the PKCS#11 tests need SoftHSM2 (apt-get install softhsm2)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    hsm = SoftHsm(tmp_path_factory.mktemp("softhsm"), *found)
    old = os.environ.get("SOFTHSM2_CONF")
    os.environ["SOFTHSM2_CONF"] = str(hsm.conf)
    yield hsm
    if old is None:
        os.environ.pop("SOFTHSM2_CONF", None)
    else:
        os.environ["SOFTHSM2_CONF"] = old


# Roles are cluster-wide, shared by every test session's database (and by each
# pytest-xdist worker's). A PostgreSQL test holds this advisory lock shared; the
# few tests that change a role's attributes hold it alone (``roles_alone``).
ROLES_LOCK = 0x5EC0_0001


@pytest.fixture(scope="session")
def _roles_lock(pg_database: str) -> Iterator[Any]:
    """This test session's connection that holds the roles lock (in the server's
    own database: an advisory lock is scoped to one database)."""
    import psycopg

    with psycopg.connect(PG_SERVER_DSN, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="session")
def _pristine(pg_database: str) -> Iterator[PristineStore]:
    """This test process's kept store in the session database's ``securepad`` schema."""
    store = PristineStore(pg_database)
    yield store
    store.disconnect()


# Per test: whether its ``pad`` is the kept store (decided once, by whichever
# of ``key_file`` and ``pg_dsn`` comes first), and whether ``pad`` opened.
_LENDS = pytest.StashKey[bool]()
_OPENED = pytest.StashKey[bool]()


def _lends_kept(request: pytest.FixtureRequest) -> bool:
    """Whether this test's ``pad`` is the kept PostgreSQL store: a test that
    takes ``pg_dsn`` without ``pad`` expects an empty database."""
    stash = request.node.stash
    if _LENDS not in stash:
        callspec = getattr(request.node, "callspec", None)
        on_postgres = callspec is not None and callspec.params.get("backend") == "postgresql"
        names = request.fixturenames
        wants_a_store = (on_postgres and ("pad" in names or "new_store_location" in names)) or "pg_store_dsn" in names
        stash[_LENDS] = bool(wants_a_store and request.getfixturevalue("_pristine").kept)
    return stash[_LENDS]


@pytest.fixture
def pg_dsn(
    pg_database: str, _roles_lock: Any, _pristine: PristineStore, request: pytest.FixtureRequest
) -> Iterator[str]:
    """The session database: no store schema in it, or, for ``pad``, the kept
    store. After the test the schema is dropped, or kept when ``pad`` used it
    and it proves pristine again (``tests.support.pristine``)."""
    if not _lends_kept(request) and _pristine.kept:
        _pristine.drop()
    _roles_lock.execute("SELECT pg_advisory_lock_shared(%s)", (ROLES_LOCK,))
    try:
        yield pg_database
    finally:
        _roles_lock.execute("SELECT pg_advisory_unlock_shared(%s)", (ROLES_LOCK,))
    if request.node.stash.get(_OPENED, False):
        _pristine.give_back()
    else:
        _pristine.drop()


@pytest.fixture
def pg_store_dsn(pg_dsn: str, keyring: Keyring, key_file: Path, request: pytest.FixtureRequest) -> str:
    """``pg_dsn``'s database holding a store of ``keyring`` that no test has
    written to: the kept store, or one made now. Like ``pad``'s, it is kept
    after the test when it proves pristine again, else dropped."""
    if not _lends_kept(request):
        Scratchpad.open(pg_dsn, keyring=keyring).close()
        request.getfixturevalue("_pristine").adopt(key_file)
    request.node.stash[_OPENED] = True
    return pg_dsn


def pg_login(pg_dsn: str, attributes: str = "NOBYPASSRLS", member_of: str = "") -> Iterator[str]:
    """A DSN of ``pg_dsn``'s database for a fresh login (``LOGIN NOSUPERUSER``
    and ``attributes``) that is a member of both
    store roles (and of ``member_of``), for a store already made; dropped afterwards."""
    import psycopg

    from securepad.storage.postgres.roles import ADMIN_ROLE, APP_ROLE

    login = f"securepad_login_{secrets.token_hex(4)}"
    roles = ", ".join(role for role in (APP_ROLE, ADMIN_ROLE, member_of) if role)
    with psycopg.connect(pg_dsn, autocommit=True) as server:
        for role in (APP_ROLE, ADMIN_ROLE):  # as the first migration makes them (roles are cluster-wide)
            server.execute(
                f"DO $$ BEGIN CREATE ROLE {role} NOLOGIN NOBYPASSRLS;"
                " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
            )
        server.execute(f"CREATE ROLE {login} LOGIN NOSUPERUSER {attributes} IN ROLE {roles}")
        try:
            url = urlsplit(pg_dsn)
            yield urlunsplit(url._replace(netloc=f"{login}@{url.hostname}:{url.port or 5432}"))
        finally:
            server.execute(f"DROP ROLE IF EXISTS {login}")


@pytest.fixture
def pg_login_dsn(pg_store_dsn: str) -> Iterator[str]:
    """A plain login's DSN (no superuser, no BYPASSRLS; a member of both store
    roles) for a store made by the server's DSN with ``keyring``."""
    yield from pg_login(pg_store_dsn)


@pytest.fixture
def roles_alone(pg_dsn: str, _roles_lock: Any) -> Iterator[None]:
    """No other PostgreSQL test runs, in any test session, while this test
    changes a cluster-wide role attribute."""
    _roles_lock.execute("SELECT pg_advisory_unlock_shared(%s)", (ROLES_LOCK,))
    _roles_lock.execute("SELECT pg_advisory_lock(%s)", (ROLES_LOCK,))
    try:
        yield
    finally:
        _roles_lock.execute("SELECT pg_advisory_unlock(%s)", (ROLES_LOCK,))
        _roles_lock.execute("SELECT pg_advisory_lock_shared(%s)", (ROLES_LOCK,))


@pytest.fixture
def pg_single(pg_store_dsn: str, keyring: Keyring) -> Iterator[tuple[Scratchpad, Any]]:
    """A PostgreSQL store on a pool of one autocommit connection, with that
    pool: every call of the store runs in the one server session a test can
    inspect (its prepared statements, its plans)."""
    from psycopg_pool import ConnectionPool

    with (
        ConnectionPool(pg_store_dsn, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool,
        Scratchpad.open(pool, keyring=keyring) as pad,
    ):
        yield pad, pool


@pytest.fixture
def store_location(backend: str, request: pytest.FixtureRequest) -> Any:
    """Where ``pad`` lives: a SQLite file path, or a PostgreSQL DSN."""
    if backend == "sqlite":
        return request.getfixturevalue("db_path")
    return request.getfixturevalue("pg_dsn")


@pytest.fixture
def new_store_location(backend: str, request: pytest.FixtureRequest) -> Any:
    """Where a store of ``keyring`` that no test has written to is: a SQLite
    file path (the first open makes the store there), or ``pg_store_dsn``
    (the kept PostgreSQL store, or one made now): for a test that opens the
    store itself, with ``keyring`` and the default policy."""
    if backend == "sqlite":
        return request.getfixturevalue("db_path")
    return request.getfixturevalue("pg_store_dsn")


@pytest.fixture
def pad(store_location: Any, keyring: Keyring, key_file: Path, request: pytest.FixtureRequest) -> Iterator[Scratchpad]:
    """A store of the test's backend: on PostgreSQL, the kept store or a new one
    (kept after the test when it proves pristine again)."""
    with Scratchpad.open(store_location, keyring=keyring) as store:
        if not isinstance(store_location, Path):
            if not _lends_kept(request) and key_file.is_file():
                request.getfixturevalue("_pristine").adopt(key_file)
            request.node.stash[_OPENED] = True
        yield store


@pytest.fixture
def alice() -> Principal:
    return ALICE


@pytest.fixture
def bob() -> Principal:
    return BOB


@pytest.fixture
def small_disk_mib() -> int:
    """The size of ``small_disk`` in MiB (a test module may override it)."""
    return 4


@pytest.fixture
def small_disk(tmp_path: Path, small_disk_mib: int) -> Iterator[Path]:
    """A small tmpfs (we run as root); the test fails if it cannot be mounted."""
    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={small_disk_mib}m,mode=0700", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.fail(f"cannot mount a small tmpfs (needs root): {mounted.stderr.decode()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture(scope="session")
def moto_kms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoKms]:
    """moto's KMS server on 127.0.0.1 for this test process, IAM enforced: users
    ``admin`` (everything), ``securepad`` (the documented actions) and
    ``no-decrypt`` (those but kms:Decrypt)."""
    server = start_moto(tmp_path_factory.mktemp("moto") / "moto_server.log")
    try:
        server.add_user("admin", ["kms:*", "iam:*"])
        server.add_user("securepad", SECUREPAD_ACTIONS)
        server.add_user("no-decrypt", [a for a in SECUREPAD_ACTIONS if a != "kms:Decrypt"])
        server.enforce_iam()
        yield server
    finally:
        server.stop()


@pytest.fixture
def kms_env(moto_kms: MotoKms, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> MotoKms:
    """This test (and the processes it starts) acts as the ``securepad`` IAM
    user against ``moto_kms``, and reads no AWS file or variable of the machine."""
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name, value in moto_kms.aws_environment().items():
        monkeypatch.setenv(name, value)
    return moto_kms


@pytest.fixture
def kms_key(kms_env: MotoKms) -> str:
    """A new KMS key's URI, ``aws-kms://arn:aws:kms:…``, usable by this test."""
    return "aws-kms://" + kms_env.new_key()
