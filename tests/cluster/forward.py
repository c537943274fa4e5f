"""TCP forwarding from the host's loopback into the real node's network namespace.

With ``up --real-node`` the control plane runs inside a network namespace of the cluster's own (so the API
server reaches the kubelet and pods, and pods reach the API server), and nothing may change on the host's
network. The host still needs a few ports (the API server for kubectl and tests, etcd and KubeRay's probe
for their health checks): the manager opens a listening socket on the host's 127.0.0.1:PORT, starts this
process inside the namespace with the socket inherited, and every accepted connection is relayed to
127.0.0.1:PORT inside the namespace. Sockets keep the namespace they were created in, so no interface,
route or iptables rule is added anywhere.

    python -m tests.cluster.forward FD:PORT [FD:PORT ...]
"""

from __future__ import annotations

import socket
import sys
import threading


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _relay(client: socket.socket, port: int) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _serve(listener: socket.socket, port: int) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_relay, args=(client, port), daemon=True).start()


def main(argv: list[str]) -> int:
    pairs = [tuple(int(part) for part in arg.split(":")) for arg in argv]
    if not pairs:
        print(__doc__, file=sys.stderr)
        return 2
    threads = []
    for fd, port in pairs:
        listener = socket.socket(fileno=fd)
        thread = threading.Thread(target=_serve, args=(listener, port), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
