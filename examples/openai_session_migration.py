"""From SQLiteSession (or EncryptedSession) to SecurepadSession: a conversation
is moved into securepad and the agent carries on with it."""

import asyncio
import tempfile
from pathlib import Path

from agents import Agent, RunConfig, Runner, SQLiteSession
from agents.testing import ModelStep, ScriptedModel, assistant_message

from securepad import Keyring, Principal, Scratchpad
from securepad.integrations.openai_agents import SecurepadSession


def remembering_model() -> ScriptedModel:
    """A stand-in for a real model: it answers with every user message it was sent."""

    def answer(call):  # type: ignore[no-untyped-def]
        said = [item["content"] for item in call.input if isinstance(item, dict) and item.get("role") == "user"]
        return ModelStep(output=[assistant_message(" / ".join(said))])

    return ScriptedModel([ModelStep(responder=answer) for _ in range(3)])


async def main(tmp: Path) -> None:
    agent = Agent(name="assistant", instructions="Be brief.", model=remembering_model())
    run_config = RunConfig(tracing_disabled=True)

    # Before: the conversation in the SDK's SQLite file, in clear, with no owner.
    old = SQLiteSession("conversation-7", str(tmp / "conversations.db"))
    await Runner.run(agent, "my order is 1234", session=old, run_config=run_config)

    # After: one line changes, the session. Items move over with get_items / add_items.
    keyring = Keyring.from_key_file(tmp / "key")
    with Scratchpad.open(tmp / "securepad.db", keyring=keyring) as pad:
        session = SecurepadSession("conversation-7", pad, Principal("user-17", "assistant", "web"))
        await session.add_items(await old.get_items())
        await old.clear_session()
        old.close()

        result = await Runner.run(agent, "where is it?", session=session, run_config=run_config)
        print("answer:", result.final_output)
        print("items:", len(await session.get_items()))
        other = SecurepadSession("conversation-7", pad, Principal("user-18", "assistant", "web"))
        print("user-18 sees:", await other.get_items())


with tempfile.TemporaryDirectory() as tmp:
    asyncio.run(main(Path(tmp)))
