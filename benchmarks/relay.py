"""The delay relay and the echo server of the emulated hosts (:mod:`benchmarks.hosts`), run inside a host.

``python relay.py relay --rtt-ms R``: a transparent relay. An ``iptables ... REDIRECT``
rule in the host (set by :mod:`benchmarks.hosts`) sends it every incoming TCP
connection; it finds the original destination with ``SO_ORIGINAL_DST``, connects there
and forwards each chunk after half the round trip ``R``, in each direction, in order.
``python relay.py echo``: an echo server that first tells each client the peer address
it sees. Each prints ``port N`` on its first line. Only the standard library: the host
runs this file as a script.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import struct
import threading
import time

__all__ = ["echo_main", "relay_main"]

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h


def _original_dst(conn: socket.socket) -> tuple[str, int]:
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!H4s", raw, 2)
    return socket.inet_ntoa(packed), port


def _reset(sock: socket.socket) -> None:
    """Close with a RST, as a refused or broken connection would look."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Link:
    """One relayed connection: two directions, each holding its chunks for ``delay`` seconds."""

    def __init__(self, a: socket.socket, b: socket.socket, delay: float) -> None:
        self.a, self.b, self.delay = a, b, delay
        self.lock = threading.Lock()
        self.open_directions = 2
        self.broken = False
        for src, dst in ((a, b), (b, a)):
            if delay > 0:
                q: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()
                threading.Thread(target=self._read, args=(src, q), daemon=True).start()
                threading.Thread(target=self._write, args=(q, dst), daemon=True).start()
            else:
                threading.Thread(target=self._forward, args=(src, dst), daemon=True).start()

    def _forward(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(262144):
                dst.sendall(data)
            self._half_close(dst)
        except OSError:
            self._break()

    def _read(self, src: socket.socket, q: queue.SimpleQueue[tuple[float, bytes]]) -> None:
        try:
            while True:
                data = src.recv(262144)
                q.put((time.monotonic() + self.delay, data))
                if not data:
                    return
        except OSError:
            q.put((0.0, b"!"))  # no delay for a broken connection
            q.put((0.0, b""))

    def _write(self, q: queue.SimpleQueue[tuple[float, bytes]], dst: socket.socket) -> None:
        try:
            while True:
                due, data = q.get()
                if due == 0.0 and data == b"!":
                    self._break()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    self._half_close(dst)
                    return
                dst.sendall(data)
        except OSError:
            self._break()

    def _half_close(self, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        with self.lock:
            self.open_directions -= 1
            done = self.open_directions == 0
        if done:
            self.a.close()
            self.b.close()

    def _break(self) -> None:
        with self.lock:
            if self.broken:
                return
            self.broken = True
        for sock in (self.a, self.b):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv on it
            sock.close()


def relay_main(rtt_ms: float, log: str | None) -> None:
    """Accept redirected connections, connect to their original destination, delay both ways."""
    delay = rtt_ms / 2000.0
    with contextlib.suppress(Exception):  # wake from sleeps on time: no 50 us timer slack
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK, 1 ns
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen(128)
    print(f"port {listener.getsockname()[1]}", flush=True)
    logf = open(log, "a", buffering=1) if log else None  # noqa: SIM115 (lives as long as the relay)
    while True:
        conn, peer = listener.accept()
        try:
            dst = _original_dst(conn)
            upstream = socket.create_connection(dst, timeout=10)
            upstream.settimeout(None)
        except OSError:
            _reset(conn)
            continue
        for s in (conn, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if logf is not None:
            logf.write(f"{peer[0]}:{peer[1]} {dst[0]}:{dst[1]}\n")
        _Link(conn, upstream, delay)


def echo_main() -> None:
    """Echo server: tells each client the peer address it sees, then echoes everything."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("0.0.0.0", 0))
    listener.listen(16)
    print(f"port {listener.getsockname()[1]}", flush=True)

    def serve(conn: socket.socket, peer: str) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            conn.sendall(f"{peer}\n".encode())
            while data := conn.recv(65536):
                conn.sendall(data)

    while True:
        conn, (peer, _) = listener.accept()
        threading.Thread(target=serve, args=(conn, peer), daemon=True).start()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    r = sub.add_parser("relay", help="the transparent delay relay (run inside a host)")
    r.add_argument("--rtt-ms", type=float, default=0.0)
    r.add_argument("--log", default=None)
    sub.add_parser("echo", help="an echo server (run inside a host)")
    args = parser.parse_args()
    if args.what == "relay":
        relay_main(args.rtt_ms, args.log)
    else:
        echo_main()
