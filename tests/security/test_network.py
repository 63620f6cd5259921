"""Network: nothing leaves the sandbox. Every attempt happens inside the network-less container;
the host itself never sends traffic to a non-loopback address."""

from __future__ import annotations

import errno
import json
import socket

import pytest

from .conftest import GVISOR, NO_ROUTE, still_serves

pytestmark = pytest.mark.docker

#: A netlink change without CAP_NET_ADMIN: gVisor answers EACCES where Linux answers EPERM.
NOT_ADMIN = errno.EACCES if GVISOR else errno.EPERM

CONNECT = r"""
import json, socket, sys
answers = {}
for target in json.loads(sys.argv[1]):
    family = socket.AF_INET6 if ':' in target[0] else socket.AF_INET
    kind = socket.SOCK_DGRAM if target[2] == 'udp' else socket.SOCK_STREAM
    with socket.socket(family, kind) as sock:
        sock.settimeout(3)
        try:
            if kind == socket.SOCK_DGRAM:
                sock.sendto(b'x', (target[0], target[1]))
                sock.recvfrom(1)
            else:
                sock.connect((target[0], target[1]))
            answers['%s:%s/%s' % tuple(target)] = 'reached'
        except OSError as error:
            answers['%s:%s/%s' % tuple(target)] = error.errno or str(error)
print(json.dumps(answers))
"""


async def reach(attacker, *targets: tuple[str, int, str]) -> dict[str, object]:
    return await attacker.probe(CONNECT, json.dumps(targets))


async def test_tcp_out(attacker):
    """TCP connections to public addresses (a public DNS server's 53 and 443, IPv4 and IPv6).

    Fail at once with ENETUNREACH (EHOSTUNREACH under gVisor): the container has only a loopback interface and no route.
    """
    answers = await reach(attacker, ("1.1.1.1", 443, "tcp"), ("8.8.8.8", 53, "tcp"),
                          ("2606:4700:4700::1111", 443, "tcp"))
    assert set(answers.values()) <= {NO_ROUTE, errno.EADDRNOTAVAIL}, answers
    await still_serves(attacker)


async def test_udp_out(attacker):
    """UDP datagrams to public addresses (DNS on 8.8.8.8:53, NTP on 1.1.1.1:123).

    sendto fails with ENETUNREACH (EHOSTUNREACH under gVisor).
    """
    answers = await reach(attacker, ("8.8.8.8", 53, "udp"), ("1.1.1.1", 123, "udp"))
    assert set(answers.values()) == {NO_ROUTE}, answers
    await still_serves(attacker)


async def test_dns(attacker):
    """Name resolution of a public name through the resolver configured in /etc/resolv.conf.

    Fails (no route to any name server): socket.gaierror, nothing resolved.
    """
    code = r"""
import json, socket
try:
    print(json.dumps(socket.getaddrinfo('example.com', 443)))
except socket.gaierror as error:
    print(json.dumps({'gaierror': error.errno}))
"""
    assert "gaierror" in await attacker.probe(code)
    await still_serves(attacker)


async def test_raw_and_packet_sockets(attacker):
    """Raw IP sockets (ICMP, a crafted TCP SYN) and AF_PACKET sockets to sniff or forge frames.

    Refused: no CAP_NET_RAW for raw sockets; AF_PACKET is not an allowed socket family in the profile.
    """
    code = r"""
import json, socket
answers = {}
for name, args in {'raw-icmp': (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
                   'raw-tcp': (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP),
                   'raw-ipv6': (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
                   'packet': (socket.AF_PACKET, socket.SOCK_RAW, 0x0300)}.items():
    try:
        socket.socket(*args).close()
        answers[name] = 0
    except OSError as error:
        answers[name] = error.errno
print(json.dumps(answers))
"""
    assert set((await attacker.probe(code)).values()) == {errno.EPERM}
    await still_serves(attacker)


async def test_host_loopback_services(attacker):
    """A service listening on the host's 127.0.0.1, and on all the host's addresses, probed from inside.

    127.0.0.1 inside is the container's own loopback (ECONNREFUSED); the host's bridge address is unreachable; the host's listeners never see a connection.
    """
    with socket.create_server(("127.0.0.1", 0)) as loopback, socket.create_server(("0.0.0.0", 0)) as everywhere:
        loopback.setblocking(False)
        everywhere.setblocking(False)
        port, wide = loopback.getsockname()[1], everywhere.getsockname()[1]
        answers = await reach(attacker, ("127.0.0.1", port, "tcp"), ("::1", port, "tcp"),
                              ("127.0.0.1", wide, "tcp"), ("172.17.0.1", wide, "tcp"))
        for server in (loopback, everywhere):
            with pytest.raises(BlockingIOError):
                server.accept()
    assert answers.pop(f"::1:{port}/tcp") in (errno.ECONNREFUSED, errno.EADDRNOTAVAIL)  # IPv6 may be off
    assert answers == {f"127.0.0.1:{port}/tcp": errno.ECONNREFUSED, f"127.0.0.1:{wide}/tcp": errno.ECONNREFUSED,
                       f"172.17.0.1:{wide}/tcp": NO_ROUTE}
    await still_serves(attacker)


async def test_cloud_metadata(attacker):
    """The cloud metadata services (169.254.169.254 over HTTP, fd00:ec2::254, 100.100.100.200).

    Unreachable (ENETUNREACH; EHOSTUNREACH under gVisor): a command cannot fetch the machine's cloud credentials.
    """
    answers = await reach(attacker, ("169.254.169.254", 80, "tcp"), ("fd00:ec2::254", 80, "tcp"),
                          ("100.100.100.200", 80, "tcp"))
    assert set(answers.values()) <= {NO_ROUTE, errno.EADDRNOTAVAIL}, answers
    await still_serves(attacker)


async def test_new_network_interface(attacker):
    """Creating a network interface and a default route over netlink (RTM_NEWLINK, RTM_NEWROUTE).

    The kernel answers EPERM (gVisor: EACCES): the command has no CAP_NET_ADMIN; only the loopback interface exists afterwards.
    """
    code = r"""
import json, socket, struct
def request(kind, body):
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        flags = 0x1 | 0x4 | 0x400 | 0x200  # REQUEST | ACK | CREATE | EXCL
        sock.send(struct.pack('=IHHII', 16 + len(body), kind, flags, 1, 0) + body)
        answer = sock.recv(65536)
        return -struct.unpack('=i', answer[16:20])[0]
def attribute(kind, data):
    size = 4 + len(data)
    return struct.pack('=HH', size, kind) + data + b'\0' * (-size % 4)
link = struct.pack('=BxHiII', 0, 0, 0, 0, 0) + attribute(3, b'evil0\0') + attribute(18, attribute(1, b'dummy\0'))
route = struct.pack('=BBBBBBBBI', socket.AF_INET, 0, 0, 0, 254, 3, 1, 1, 0) + attribute(5, socket.inet_aton('10.0.0.1'))
print(json.dumps({'newlink': request(16, link), 'newroute': request(24, route),
                  'interfaces': [name for _, name in socket.if_nameindex()]}))
"""
    answers = await attacker.probe(code)
    assert answers == {"newlink": NOT_ADMIN, "newroute": NOT_ADMIN, "interfaces": ["lo"]}
    await still_serves(attacker)
