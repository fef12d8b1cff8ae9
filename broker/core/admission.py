"""Admission of new client sockets per source address (issue #12; docs/security.md "Limits").

Implements the per-IP limits of ``limits.max_connections_per_ip`` (concurrent sockets, counted
from accept to close, CONNECT or not) and ``limits.connect_rate_per_ip`` (a token bucket per
address: ``rate`` tokens per second, bursts up to ``2 * rate``). Not from a seed paper: the
resource limits every public MQTT broker needs (mosquitto ``max_connections``, EMQX
``max_conn_rate``).

A socket over a limit is not closed at once: it is answered at its CONNECT with the MQTT 5 reason
code (0x97 Quota exceeded, 0x9F Connection rate exceeded; a 3.1.1 client gets return code 3
Server unavailable), so a client learns why. Until then it is bounded like any unauthenticated
socket (``limits.max_connect_packet_bytes``, ``limits.connect_timeout_s``).

Pure: ``now`` (monotonic seconds) is passed in; no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.mqtt.packets import ReasonCode

_FORGET_AFTER_S = 60.0  # an address idle this long (no socket, bucket full) is forgotten
_SWEEP_EVERY = 1024  # admissions between sweeps of forgotten addresses


@dataclass(slots=True)
class _Address:
    sockets: int = 0
    tokens: float = 0.0
    updated_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a socket is refused at its CONNECT: the CONNACK reason code and the log line's reason."""

    reason_code: int
    reason: str


class Admission:
    """Per-address socket counts and connect-rate buckets (0 disables a limit)."""

    def __init__(self, *, max_per_ip: int, rate_per_ip: int) -> None:
        self.max_per_ip = max_per_ip
        self.rate_per_ip = rate_per_ip
        self._addresses: dict[str, _Address] = {}
        self._admitted = 0

    @property
    def enabled(self) -> bool:
        return bool(self.max_per_ip or self.rate_per_ip)

    def opened(self, address: str, now: float) -> Refusal | None:
        """A socket from ``address`` was accepted; the refusal it gets at its CONNECT, or None.
        Every ``opened`` is matched by one :meth:`closed`."""
        if not self.enabled:
            return None
        state = self._addresses.get(address)
        if state is None:
            state = self._addresses[address] = _Address(0, 2.0 * self.rate_per_ip, now)
        state.sockets += 1
        self._admitted += 1
        if self._admitted % _SWEEP_EVERY == 0:
            self._sweep(now)
        if self.rate_per_ip:
            burst = 2.0 * self.rate_per_ip
            state.tokens = min(burst, state.tokens + (now - state.updated_at) * self.rate_per_ip)
            state.updated_at = now
            if state.tokens < 1.0:
                return Refusal(
                    ReasonCode.CONNECTION_RATE_EXCEEDED,
                    f"more than {self.rate_per_ip} connections per second from {address}",
                )
            state.tokens -= 1.0
        if self.max_per_ip and state.sockets > self.max_per_ip:
            return Refusal(
                ReasonCode.QUOTA_EXCEEDED, f"more than {self.max_per_ip} connections from {address}"
            )
        return None

    def closed(self, address: str) -> None:
        state = self._addresses.get(address)
        if state is not None and state.sockets > 0:
            state.sockets -= 1

    def sockets(self, address: str) -> int:
        state = self._addresses.get(address)
        return state.sockets if state is not None else 0

    def _sweep(self, now: float) -> None:
        burst = 2.0 * self.rate_per_ip
        for address, state in list(self._addresses.items()):
            idle = now - state.updated_at > _FORGET_AFTER_S
            if state.sockets == 0 and (idle or state.tokens >= burst):
                del self._addresses[address]


class TokenBucket:
    """``rate`` tokens per second, holding at most ``burst``; starts full."""

    __slots__ = ("burst", "rate", "tokens", "updated_at")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.updated_at = now

    def take(self, now: float) -> bool:
        """Take one token; False (nothing taken) when the bucket is empty."""
        self.tokens = min(self.burst, self.tokens + (now - self.updated_at) * self.rate)
        self.updated_at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


def peer_name(peer: Any) -> str:
    """``host:port`` of a socket address as asyncio's ``get_extra_info("peername")`` gives it."""
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer or "")


def transport_peer_name(transport: Any) -> str:
    """The peer name of an asyncio transport, asked when needed: the transport keeps the address
    (uvloop as a C struct), so a connection need not keep the string (64 B per idle one)."""
    get_extra_info = getattr(transport, "get_extra_info", None)
    return peer_name(get_extra_info("peername")) if get_extra_info is not None else ""


def address_of(peer: str) -> str:
    """The IP address of a ``host:port`` / ``[v6]:port`` peer name (the name itself otherwise)."""
    if peer.startswith("["):
        return peer[1 : peer.find("]")] if "]" in peer else peer
    host, sep, port = peer.rpartition(":")
    if sep and port.isdigit() and host.count(":") == 0:
        return host
    if sep and port.isdigit() and host:  # an unbracketed IPv6 address with a port
        return host
    return peer
