"""The Gradio page: its Blocks (page.py), the Chat tab (chat.py), the Race tab (race.py), their
HTML (render.py), theme, pictures, refusals and the typed-text guard (literal.py).

May import: webapp.serving, the top-level leaf webapp.netinfo, core, gradio. Nothing in webapp
imports ui except the composition root (webapp/server.py, webapp/cli.py): the page is one front
end of the model host, the HTTP API (webapp.api) the other, and neither knows of the other.
"""
