"""Private network helpers of the built-ins that speak HTTP.

``transport``: the public-destination check before a request (addresses and the network seam
live in :mod:`protolink.net`); ``http1``: one bounded HTTP/1.1 exchange over a pinned
connection (web_search, fetch_url); ``html``: text extraction with the standard library parser;
``media``: header and media-type rules (also used by http_tool).
"""
