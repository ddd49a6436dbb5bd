"""The migration guide from SqliteSaver / PostgresSaver: its example runs as
written, prints what the guide shows, and is the example file itself."""

from __future__ import annotations

import operator
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypedDict

import pytest

from securepad import Principal, Scratchpad
from tests.support.paths import ROOT

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.graph import StateGraph


pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("langgraph")]

EXAMPLE = ROOT / "examples" / "langgraph_saver_migration.py"
GUIDE = (ROOT / "docs" / "integrations" / "langgraph-saver.md").read_text(encoding="utf-8")


def _run(tmp_path: Path) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.iterdir()) == []  # everything it made lived in its own temporary directory
    return result.stdout


def test_the_example_runs_and_prints_what_the_guide_shows(tmp_path: Path) -> None:
    shown = re.search(r"It prints:\n\n```\n(.*?)```", GUIDE, re.S)
    assert shown is not None
    assert _run(tmp_path) == shown.group(1)


def test_the_guide_shows_the_example_as_it_is() -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE, re.S)
    assert EXAMPLE.read_text(encoding="utf-8") in blocks


class Job(TypedDict, total=False):
    request: str
    log: Annotated[list[str], operator.add]


JOB: RunnableConfig = {"configurable": {"thread_id": "job-42"}}


def _job() -> StateGraph:
    """The guide's graph: a plan, then a human approval (an interrupt)."""

    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    def plan(state: Job) -> Job:
        return {"log": [f"planned {state['request']}"]}

    def approve(state: Job) -> Job:
        return {"log": [f"approved: {interrupt('run it?')}"]}

    builder = StateGraph(Job)
    builder.add_node("plan", plan)
    builder.add_node("approve", approve)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "approve")
    builder.add_edge("approve", END)
    return builder


def test_a_thread_moves_over_from_postgres_saver_as_the_guide_says(
    pad: Scratchpad, alice: Principal, pg_database: str
) -> None:
    """The guide's ``import_thread`` from a real PostgresSaver (in a schema of its
    own): a thread paused at an interrupt resumes on SecurepadSaver."""
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.types import Command

    from securepad.integrations.langgraph import SecurepadSaver

    schema = f"lg_{secrets.token_hex(4)}"
    with psycopg.connect(pg_database, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            dsn = f"{pg_database}?options=-csearch_path%3D{schema}"
            with PostgresSaver.from_conn_string(dsn) as old:
                old.setup()
                _job().compile(checkpointer=old).invoke({"request": "backup"}, JOB)
                saver = SecurepadSaver(pad, alice)
                assert saver.import_thread(old, "job-42") == len(list(old.list(JOB))) == 3
                old.delete_thread("job-42")
                assert list(old.list(JOB)) == []
            graph = _job().compile(checkpointer=saver)
            assert graph.get_state(JOB).next == ("approve",)
            assert graph.invoke(Command(resume="yes"), JOB)["log"] == ["planned backup", "approved: yes"]
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")
