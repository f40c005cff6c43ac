"""Bytes this process has really sent over TCP, from the kernel's per-socket counters.

Benchmarks that report "bytes moved per rank" run their job over TCP (HOROVOD_SHM_DISABLE=1)
and read this before and after the part they measure: the difference is every payload byte the
rank's sockets handed to the network in between (data and the core's negotiation messages,
point-to-point included), counted by the kernel rather than by a formula.
"""

import os
import socket
import struct

# struct tcp_info (linux/tcp.h): tcpi_bytes_sent (Linux 4.19+) counts retransmitted bytes too,
# tcpi_bytes_retrans those alone.
_BYTES_SENT, _BYTES_RETRANS = 200, 208


def tcp_bytes_sent():
    """The payload bytes sent, retransmissions left out, summed over this process's open TCP
    sockets (a socket closed since is forgotten: measure within one job)."""
    total = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            dup = os.dup(fd)
        except OSError:
            continue
        sock = socket.socket(fileno=dup)
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET,
                                                                      socket.AF_INET6):
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            if len(info) >= _BYTES_RETRANS + 8:
                sent, retrans = struct.unpack_from("QQ", info, _BYTES_SENT)
                total += sent - retrans
        except OSError:
            pass
        finally:
            sock.close()
    return total
