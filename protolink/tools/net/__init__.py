"""Private network helpers of the web built-ins (web_search, fetch_url).

``addresses``: the one public-destination rule; ``transport``: DNS and pinned connections behind a
replaceable :class:`~protolink.tools.net.transport.Network`; ``http1``: one bounded HTTP/1.1
exchange over such a connection; ``html``: text extraction with the standard library parser.
"""
