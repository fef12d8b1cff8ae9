"""A TCP port forward on loopback (threads copying bytes both ways), for tests where a broker is
reached at an address that is not its own - as behind a NAT, a Service port or a stale DNS
record: the dialer meant one broker, another one answers."""

from __future__ import annotations

import socket
import threading

HOST = "127.0.0.1"
CONNECT_TIMEOUT_S = 10.0


class PortForward:
    """Listens on a free port (``port``: bound to port 0, so never a fixed one) and forwards each
    connection to ``HOST:target_port``; ``close`` ends the listener and every copy."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.server = socket.create_server((HOST, 0))
        self.port: int = self.server.getsockname()[1]
        self.connections = 0  # connections forwarded so far
        self.sockets: list[socket.socket] = [self.server]
        threading.Thread(target=self._accept, name="port-forward", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                inbound, _ = self.server.accept()
                outbound = socket.create_connection((HOST, self.target_port), timeout=CONNECT_TIMEOUT_S)
            except OSError:
                return
            outbound.settimeout(None)
            self.connections += 1
            self.sockets += [inbound, outbound]
            for source, sink in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(target=self._copy, args=(source, sink), daemon=True).start()

    @staticmethod
    def _copy(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
