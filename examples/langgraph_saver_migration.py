"""From SqliteSaver to SecurepadSaver: a thread paused at a human approval on
LangGraph's SqliteSaver is moved into securepad and resumed there."""

import operator
import tempfile
from pathlib import Path
from typing import Annotated, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from securepad import Keyring, Principal, Scratchpad
from securepad.integrations.langgraph import SecurepadSaver


class Job(TypedDict, total=False):
    request: str
    log: Annotated[list[str], operator.add]


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
config = {"configurable": {"thread_id": "job-42"}}

with tempfile.TemporaryDirectory() as tmp:
    # Before: the graph's state in LangGraph's own SQLite file, in clear, with no owner.
    with SqliteSaver.from_conn_string(str(Path(tmp) / "checkpoints.db")) as old:
        builder.compile(checkpointer=old).invoke({"request": "nightly backup"}, config)

        # After: one line changes, the checkpointer. Threads move over with import_thread.
        keyring = Keyring.from_key_file(Path(tmp) / "key")
        with Scratchpad.open(Path(tmp) / "securepad.db", keyring=keyring) as pad:
            saver = SecurepadSaver(pad, Principal("user-17", "ops-agent", "web"))
            print("checkpoints moved:", saver.import_thread(old, "job-42"))
            old.delete_thread("job-42")

            graph = builder.compile(checkpointer=saver)
            print("waiting at:", graph.get_state(config).next)
            print("log:", graph.invoke(Command(resume="yes"), config)["log"])
            # Another owner asking for the same thread id finds nothing.
            other = SecurepadSaver(pad, Principal("user-18", "ops-agent", "web"))
            print("user-18 sees:", other.get_tuple(config))
