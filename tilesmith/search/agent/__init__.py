"""The Deep Agent optimizer, one module per concern (the entry point is optimizer.run_track).

optimizer.py  sets a track up (provider, skills, the agent) and runs its turns
loop.py       the LangGraph loop: decide -> agent turn -> gate -> decide
tools.py      the agent's tools (evaluate, profile, ...) and its system prompt
budget.py     the model-call budget shared by the agent and its subagents
provider.py   the OpenAI-compatible provider: settings, the connection check, the chat model
shell.py      the agent's shell: clean environment, process-group kill
trace.py      per-turn timing of model and tool calls

This file stays empty on purpose: provider.py needs no LangChain, and `optimize` checks the provider
before it loads the rest.
"""
