"""Adapters for agent frameworks; each needs its extra and is imported by its own name.

- ``securepad.integrations.openai_agents``: the OpenAI Agents SDK (extra ``openai``);
- ``securepad.integrations.langgraph``: LangGraph and LangChain (extra ``langgraph``).

The MCP server is ``securepad.integrations.mcp`` (extra ``mcp``, command ``securepad mcp``).
"""
