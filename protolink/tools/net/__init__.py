"""Private network helpers of the built-ins that speak HTTP.

``addresses``: the one public-destination rule; ``transport``: DNS and pinned connections behind a
replaceable :class:`~protolink.tools.net.transport.Network`; ``http1``: one bounded HTTP/1.1
exchange over such a connection (web_search, fetch_url); ``html``: text extraction with the
standard library parser; ``media``: header and media-type rules (also used by http_tool).
"""
