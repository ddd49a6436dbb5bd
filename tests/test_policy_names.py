"""A shipped policy's name means the shipped policy, whatever files the working
directory holds; a policy file is named by a path and must be one no one else
could have written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from securepad import Keyring, Policy, PolicyError, Scratchpad
from securepad.cli import ENVIRONMENT, main
from securepad.policy import bundled_policy_path

# What a planter would want: the widest scope and a quota past every limit.
PLANTED = '[access]\nscope = "owner"\n[limits]\nowner_quota_bytes = 1125899906842624\n'
MINE = '[access]\nscope = "owner+channel"\n'


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    work = tmp_path / "work"
    work.mkdir(mode=0o755)
    monkeypatch.chdir(work)
    return work


def plant(directory: Path, name: str, text: str, mode: int = 0o644) -> Path:
    path = directory / name
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("name", Policy.shipped())
def test_a_file_in_the_working_directory_never_stands_in_for_a_shipped_name(workdir: Path, name: str) -> None:
    plant(workdir, name, PLANTED)
    shipped = Policy.load(name)
    assert shipped == Policy.load(bundled_policy_path(name))
    assert shipped.owner_quota_bytes != 1 << 50


def test_a_store_opened_with_a_shipped_name_gets_the_shipped_policy(workdir: Path, tmp_path: Path) -> None:
    plant(workdir, "strict", PLANTED)
    keyring = Keyring.from_key_file(tmp_path / "config" / "key")
    with Scratchpad.open(tmp_path / "data" / "s.db", keyring=keyring, policy="strict") as pad:
        assert pad.policy.scope == "owner+channel+actor"
        assert pad.policy.owner_quota_bytes == Policy.load("strict").owner_quota_bytes


def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str | None]:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", *(var for var, _, _ in ENVIRONMENT)):
        monkeypatch.delenv(var, raising=False)
    return {"HOME": str(home), "XDG_DATA_HOME": None, "XDG_CONFIG_HOME": None} | {v: None for v, _, _ in ENVIRONMENT}


@pytest.mark.parametrize("how", ["option", "environment"])
def test_the_cli_reads_a_shipped_name_as_the_shipped_policy(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # Not TOML at all: reading it would fail the command.
    plant(workdir, "strict", "this is [[ not a policy\n")
    env = cli_env(tmp_path, monkeypatch)
    args = ["--policy", "strict", "init"] if how == "option" else ["init"]
    if how == "environment":
        env["SECUREPAD_POLICY"] = "strict"
    result = CliRunner().invoke(main, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0].endswith("(policy strict)")  # then the key file's line


def test_a_bare_name_that_is_not_shipped_is_refused_and_the_message_shows_the_path(workdir: Path) -> None:
    plant(workdir, "mine", MINE)
    with pytest.raises(PolicyError, match=r"no shipped policy named 'mine'.*\./mine"):
        Policy.load("mine")


@pytest.mark.parametrize("given", ["./mine.toml", "mine.toml", "sub/mine.toml", "./sub/mine.toml", "PATH", "ABSOLUTE"])
def test_a_policy_file_is_named_by_a_path(workdir: Path, given: str) -> None:
    (workdir / "sub").mkdir(mode=0o755)
    plant(workdir, "mine.toml", MINE)
    plant(workdir / "sub", "mine.toml", MINE)
    where: str | Path = given
    if given == "PATH":
        where = Path("mine.toml")
    elif given == "ABSOLUTE":
        where = str(workdir / "mine.toml")
    assert Policy.load(where).scope == "owner+channel"


def test_a_file_without_the_toml_suffix_needs_a_separator(workdir: Path) -> None:
    plant(workdir, "mine", MINE)
    assert Policy.load("./mine").scope == "owner+channel"
    assert Policy.load(Path("mine")).scope == "owner+channel"


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_a_policy_file_others_may_write_is_refused(workdir: Path, mode: int) -> None:
    path = plant(workdir, "mine.toml", MINE, mode)
    with pytest.raises(PolicyError, match=r"others may write it; run: chmod go-w"):
        Policy.load(path)
    assert Policy.load(path, allow_shared=True).scope == "owner+channel"


def test_a_policy_file_others_may_read_is_accepted(workdir: Path) -> None:
    assert Policy.load(plant(workdir, "mine.toml", MINE, 0o644)).scope == "owner+channel"
    assert Policy.load(plant(workdir, "private.toml", MINE, 0o600)).scope == "owner+channel"


def test_a_policy_file_in_a_directory_anyone_may_write_is_refused(workdir: Path) -> None:
    shared = workdir / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    path = plant(shared, "mine.toml", MINE)
    with pytest.raises(PolicyError, match=r"policy file's directory .* anyone may plant"):
        Policy.load(path)
    assert Policy.load(path, allow_shared=True).scope == "owner+channel"


def test_a_policy_file_in_the_working_directory_anyone_may_write_is_refused(workdir: Path) -> None:
    workdir.chmod(0o777)
    plant(workdir, "mine.toml", MINE)
    with pytest.raises(PolicyError, match=r"policy file's directory"):
        Policy.load("mine.toml")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file away needs root")
def test_a_policy_file_of_another_user_is_refused(workdir: Path) -> None:
    path = plant(workdir, "mine.toml", MINE)
    os.chown(path, 4321, 4321)
    with pytest.raises(PolicyError, match=r"belongs to uid 4321"):
        Policy.load(path)
    assert Policy.load(path, allow_shared=True).scope == "owner+channel"
    os.chown(path, 0, 0)  # root's files are trusted: only root could have written them
    assert Policy.load(path).scope == "owner+channel"


def test_an_unreadable_policy_path_is_a_policy_error(workdir: Path) -> None:
    with pytest.raises(PolicyError, match=r"cannot read policy file .*absent\.toml"):
        Policy.load("absent.toml")
    (workdir / "dir.toml").mkdir()
    with pytest.raises(PolicyError, match=r"cannot read policy file .*dir\.toml"):
        Policy.load("dir.toml")


@pytest.mark.parametrize("allow_shared", [False, True])
def test_a_policy_path_that_is_not_a_regular_file_is_refused_at_once(workdir: Path, allow_shared: bool) -> None:
    os.mkfifo(workdir / "fifo.toml", 0o600)  # opened for reading, it would wait for a writer for good
    with pytest.raises(PolicyError, match=r"cannot read policy file .*fifo\.toml: not a regular file"):
        Policy.load("fifo.toml", allow_shared=allow_shared)
    with pytest.raises(PolicyError, match=r"not a regular file"):
        Policy.load("/dev/null", allow_shared=allow_shared)


def test_a_policy_file_reached_through_a_link_into_a_directory_anyone_may_write_is_refused(workdir: Path) -> None:
    shared = workdir / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (workdir / "mine.toml").symlink_to(plant(shared, "real.toml", MINE))
    with pytest.raises(PolicyError, match=r"policy file's directory .*shared .* anyone may plant"):
        Policy.load("mine.toml")
    assert Policy.load("mine.toml", allow_shared=True).scope == "owner+channel"
    shared.chmod(0o755)
    assert Policy.load("mine.toml").scope == "owner+channel"
