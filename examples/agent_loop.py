"""A scripted agent loop on securepad: no LLM, the tool calls a model would make.

The loop reads a large generated log (offloaded: the model sees a summary and
an id), finds the errors at its end with grep through the scratchpad_read
tool, reads the lines around the first one, and writes a copy of the log
through a {{step1.content}} reference, resolved from the store.
"""

import json
import tempfile
from pathlib import Path

from securepad import Keyring, Principal, Scratchpad

with tempfile.TemporaryDirectory() as tmp:
    work = Path(tmp)
    log_path = work / "service.log"
    lines = [
        f"2024-05-01T10:{i // 60 % 60:02d}:{i % 60:02d} INFO request {i} served in {i % 97} ms" for i in range(20_000)
    ]
    lines += ["2024-05-01T15:33:20 ERROR disk /var full", "2024-05-01T15:33:21 ERROR upload 2231 failed: no space"]
    log_path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    # The runtime's tools. Their observations go to the store, never straight to the model.
    def read_file(path: str) -> dict:
        text = Path(path).read_text(encoding="utf-8")
        return {"content": text, "metadata": {"path": path, "bytes": len(text.encode())}}

    def write_file(path: str, content: str) -> dict:
        Path(path).write_text(content, encoding="utf-8")
        return {"ok": True, "bytes_written": len(content.encode()), "metadata": {"path": path}}

    tools = {"read_file": read_file, "write_file": write_file}

    keyring = Keyring.from_key_file(work / "config" / "key")  # created 0600 with the new store
    with Scratchpad.open(work / "data" / "store.db", keyring=keyring) as pad:
        turn = pad.turn(Principal(owner_user_id="alice", actor="agent", channel="cli"), "turn-0001")
        history: list = []  # what the model sees

        def run_tool(step: int, name: str, arguments: dict) -> dict:
            """One tool call of the model: resolve references, run, record."""
            arguments = turn.resolve(arguments)  # {{stepN.field}} -> the stored value
            observation = tools[name](**arguments)
            shown = turn.record(step, name, observation)  # the full observation is stored, encrypted
            history.append({"role": "tool", "name": name, "content": json.dumps(shown)})
            return shown

        # Step 1: the model reads the log. It is far above the offload threshold,
        # so the history gets the synthetic view: summary, size, scratchpad_id.
        view = run_tool(1, "read_file", {"path": str(log_path)})
        assert "scratchpad_id" in view and view["size_bytes"] > 1_000_000
        print(f"step 1: {view['size_bytes']} bytes stored as {view['scratchpad_id']}; the model sees a summary")

        # The model now has the scratchpad_read tool and greps the stored log.
        assert [t["function"]["name"] for t in turn.tools()] == ["scratchpad_read"]
        call = {"scratchpad_id": view["scratchpad_id"], "mode": "grep", "pattern": "ERROR|FATAL", "max_matches": 20}
        found = turn.call_tool("scratchpad_read", json.dumps(call))  # arguments as the model sent them
        history.append({"role": "tool", "name": "scratchpad_read", "content": json.dumps(found)})
        print("grep ERROR|FATAL:\n" + found["content"])
        first_error = found["metadata"]["match_lines"][0]

        # ... reads the lines just before the first error ...
        call = {"scratchpad_id": view["scratchpad_id"], "mode": "lines", "start": first_error - 2, "end": first_error}
        context = turn.call_tool("scratchpad_read", call)
        print(f"lines {first_error - 2}..{first_error}:\n" + context["content"], end="")

        # ... and a bad call gets an error it can act on, not an exception.
        oops = turn.call_tool("scratchpad_read", {"scratchpad_id": view["scratchpad_id"], "mode": "grep"})
        print("bad call:", oops["error"])

        # Step 2: the model writes a copy of the log by reference, without copying
        # a megabyte through its context: {{step1.content}} is resolved from the store.
        copy_path = work / "service.log.bak"
        written = run_tool(2, "write_file", {"path": str(copy_path), "content": "{{step1.content}}"})
        assert copy_path.read_text(encoding="utf-8") == log_path.read_text(encoding="utf-8")
        print(f"step 2: wrote {written['bytes_written']} bytes through {{{{step1.content}}}}")

        # The whole history the model saw stays small.
        print(f"history: {len(history)} messages, {sum(len(m['content']) for m in history)} characters")
        assert sum(len(m["content"]) for m in history) < 10_000
