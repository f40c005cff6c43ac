"""This machine's names and addresses: which hosts are local, and where the rendezvous listens.

No name is resolved through DNS: a host counts as local only when it is spelled as localhost,
127.x.y.z, this machine's hostname or one of its interface addresses.
"""

from __future__ import annotations

import fcntl
import functools
import ipaddress
import socket
import struct

_SIOCGIFADDR = 0x8915  # Linux ioctl: the IPv4 address of an interface
_IFNAMSIZ = 16


def interface_names() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


def interface_ipv4(name: str) -> str | None:
    """The IPv4 address of interface `name`, or None when it has none (or does not exist)."""
    if not name or len(name) >= _IFNAMSIZ:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            reply = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR,
                                struct.pack("256s", name.encode()))
        except OSError:
            return None
    return socket.inet_ntoa(reply[20:24])


@functools.cache
def local_ipv4_addresses() -> tuple[str, ...]:
    addresses = []
    for name in interface_names():
        address = interface_ipv4(name)
        if address and address not in addresses:
            addresses.append(address)
    return tuple(addresses)


@functools.cache
def _local_names() -> frozenset[str]:
    hostname = socket.gethostname()
    names = {"localhost", "localhost.localdomain", "ip6-localhost", "::1",
             hostname, hostname.split(".", 1)[0]}
    names.update(local_ipv4_addresses())
    return frozenset(name.lower() for name in names)


def is_local_host(host: str) -> bool:
    host = host.lower()
    if host in _local_names():
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def guess_routable_address() -> str:
    """An address of this machine that other hosts can likely reach: the first non-loopback
    interface address. `--network-interface` picks one explicitly when this guess is wrong."""
    for address in local_ipv4_addresses():
        if not ipaddress.ip_address(address).is_loopback:
            return address
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
