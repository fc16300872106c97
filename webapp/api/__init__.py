"""The HTTP API: OpenAI chat/completions and legacy completions, OpenAI Responses, and Anthropic
messages, on the routes of routes.py.

A request body is checked once, at the edge, by its protocol's pydantic model
(openai_request.py, responses_request.py, anthropic_request.py, with the field types and the
error mapping of fields.py, and the limits of core/limits.py); messages and tools become what
the chat template takes (messages.py, images.py, structured.py), and every protocol ends as one
ApiRequest (request.py). The reply is decoded through serving's model host (decode.py, run.py,
prompt.py) and written in each protocol's shape (format.py for OpenAI's, responses.py,
anthropic.py), tool calls parsed from the text (toolcalls.py, text.py); errors in each
protocol's shape (errors.py, anthropic.anthropic_error).

May import: webapp.serving, the top-level leaf webapp.netinfo, core, fastapi/starlette, pydantic.
Never webapp.ui: the API runs with or without the page (server.py mounts it beside the page).
"""
