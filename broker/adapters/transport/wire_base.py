"""What every part of the inter-broker wire codec (broker.adapters.transport.wire) shares:
``WireError``, the checked parse of received bytes into a generated protobuf class, and the
required-field read.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError


class WireError(ValueError):
    """A value cannot be put on the wire, or received bytes are not a valid skipmq.v1 message."""


def _parse(cls: Any, data: bytes, what: str) -> Any:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(f"{what}: expected bytes, got {type(data).__name__}")
    message = cls()
    try:
        message.ParseFromString(bytes(data))
    except DecodeError as exc:
        raise WireError(f"{what}: {len(data)} bytes are not a valid skipmq.v1.{what} ({exc})") from None
    return message


def _require(src: Any, name: str, where: str) -> Any:
    if not src.HasField(name):
        raise WireError(f"{where}: required field missing")
    return getattr(src, name)
