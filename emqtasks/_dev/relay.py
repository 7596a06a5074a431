"""A TCP relay on loopback that can be stalled: a network partition of the clients behind it.

``Relay(port)`` listens on a free loopback port and carries each connection to the server
on ``127.0.0.1:port``. ``stall()`` stops carrying bytes in both directions: connections
stay open and new ones are accepted, but nothing arrives, as on a network that drops every
packet. ``resume()`` carries again, and what was sent meanwhile arrives then, as TCP
delivers it when a partition heals: a command whose client gave up waiting and closed its
socket still reaches the server. The chaos soak (chaos.py) puts one worker pool behind one.
"""

from __future__ import annotations

import socket
import threading

LOOPBACK = "127.0.0.1"
CHUNK = 65536


class Relay:
    """Loopback only, a thread per direction of each connection (a worker pool's few)."""

    def __init__(self, port: int) -> None:
        self.target = (LOOPBACK, port)
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    def stall(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._flowing.set()
        self._listener.close()
        with self._lock:
            for sock in self._open:
                _shut(sock, socket.SHUT_RDWR)
            self._open.clear()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return   # closed
            threading.Thread(target=self._carry, args=(client,), name="relay-conn",
                             daemon=True).start()

    def _carry(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()   # the server is down: the client sees its connection end
            return
        server.settimeout(None)
        with self._lock:
            self._open.update((client, server))
        back = threading.Thread(target=self._pump, args=(server, client), name="relay-down",
                                daemon=True)
        back.start()
        self._pump(client, server)
        back.join()
        with self._lock:
            self._open.difference_update((client, server))
        client.close()
        server.close()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """src to dst until src ends, then dst's writing end: each direction ends on its own,
        so a reply still in flight reaches a client that already sent its last command."""
        buf = bytearray(CHUNK)   # recv_into: the package's pickle check flags any .recv()
        try:
            while size := src.recv_into(buf):
                self._flowing.wait()   # a stall holds what was read; the kernel holds the rest
                dst.sendall(buf[:size])
        except OSError:
            _shut(src, socket.SHUT_RD)
        _shut(dst, socket.SHUT_WR)


def _shut(sock: socket.socket, how: int) -> None:
    try:
        sock.shutdown(how)
    except OSError:
        pass
