"""The HTTP API: OpenAI chat/completions and legacy completions, OpenAI Responses, and Anthropic
messages, on the routes of routes.py. Request bodies are read and checked at the edge (request.py
and each protocol's module); the reply is decoded through serving's model host (decode.py,
run.py) and written in each protocol's shape (format.py, responses.py, anthropic.py), tool calls
(toolcalls.py) and structured output (structured.py) included.

May import: webapp.serving, the top-level leaf webapp.netinfo, core, fastapi/starlette. Never
webapp.ui: the API runs with or without the page (the page mounts it beside itself in server.py).
"""
