"""The web built-ins' destination check: resolve once, every answer public, else no request.

Connections then go to one of the validated addresses through the
:class:`~protolink.net.network.Network` seam, never to the name, while the Host header and the TLS
server name stay the URL's host.
"""

from __future__ import annotations

import ipaddress

from protolink.net.addresses import Destination, IPAddress
from protolink.net.network import current_network
from protolink.net.rules import PUBLIC_ADDRESS_RULES


async def resolve_public(destination: Destination) -> tuple[IPAddress, ...]:
    """The validated addresses of a destination; ValueError when any of them is not public.

    DNS lookup happens here, outside any transport deadline (the spec keeps it separate).
    Lookup failures raise RuntimeError.
    """
    if destination.address is not None:
        candidates: tuple[IPAddress, ...] = (destination.address,)
    else:
        try:
            answers = await current_network().resolve(destination.host, destination.port)
            candidates = tuple(ipaddress.ip_address(answer.split("%", 1)[0]) for answer in answers)
        except (OSError, UnicodeError, ValueError) as error:
            raise RuntimeError(f"could not resolve {destination.host}: {error}") from None
        if not candidates:
            raise RuntimeError(f"could not resolve {destination.host}: no addresses")
    for address in candidates:
        if PUBLIC_ADDRESS_RULES.denial(address) is not None:
            raise ValueError(f"{destination.host} is not a public destination: it resolves to {address}")
    return candidates
