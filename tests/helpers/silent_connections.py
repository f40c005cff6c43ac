"""A stranger who wants to stall a job's set-up: opens COUNT TCP connections to each address
and keeps them all open without sending a byte.

    python silent_connections.py COUNT HOST:PORT [HOST:PORT ...]

Prints "connected N1 N2 ..." (connections established per address, within 30 s) once every
attempt has finished, then holds them until its stdin closes (or 120 s pass) and prints
"closed-by-server M1 M2 ..." (how many of each the server had dropped by then) before exiting.
Stdlib only."""

import resource
import selectors
import socket
import sys
import time

# A deadline, not a wait: a busy machine's servers take a while to accept thousands.
CONNECT_SECONDS = 30.0


def raise_file_limit(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        if wanted < needed:
            sys.exit(f"silent_connections: the open-file limit ({hard}) is below {needed}")


def open_all(addresses, count):
    """Starts every connection at once (non-blocking) and waits for them to be established."""
    selector = selectors.DefaultSelector()
    opened = {address: [] for address in addresses}
    for _ in range(count):
        for address in addresses:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.connect_ex(address)
            selector.register(sock, selectors.EVENT_WRITE, address)
    deadline = time.monotonic() + CONNECT_SECONDS
    while selector.get_map() and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=max(0.0, deadline - time.monotonic())):
            selector.unregister(key.fileobj)
            if key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                opened[key.data].append(key.fileobj)
            else:
                key.fileobj.close()
    for key in list(selector.get_map().values()):  # still not established: give up on those
        key.fileobj.close()
    selector.close()
    return opened


def closed_by_server(sock):
    """True when the server has closed the connection (after whatever it sent first)."""
    try:
        while sock.recv(65536, socket.MSG_DONTWAIT):
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def main():
    count = int(sys.argv[1])
    addresses = []
    for text in sys.argv[2:]:
        host, port = text.rsplit(":", 1)
        addresses.append((host, int(port)))
    raise_file_limit(count * len(addresses) + 64)
    opened = open_all(addresses, count)
    print("connected", *(len(opened[a]) for a in addresses), flush=True)
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin, selectors.EVENT_READ)
    until = time.monotonic() + 120
    while time.monotonic() < until and not selector.select(timeout=until - time.monotonic()):
        pass
    print("closed-by-server", *(sum(1 for s in opened[a] if closed_by_server(s))
                                for a in addresses), flush=True)


if __name__ == "__main__":
    main()
