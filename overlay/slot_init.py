"""A faster ``__init__`` for the frozen, slotted dataclasses that cross the overlay's API.

Not a protocol: a construction detail. The simulator builds three of these per message (the
message of ``overlay.messages``, the ``Send`` action, the ``Receive`` event), tens of millions in
a sweep at N = 10,000 (docs/overlay-reproduction.md). The ``__init__`` that ``dataclasses``
generates for a frozen class sets each field with ``object.__setattr__(self, name, value)``,
which looks the name up on the type every time. ``slot_init`` replaces it with one that calls
each slot's own descriptor (``type.__dict__[name].__set__``), the same assignment without the
look-up: about half the cost. Nothing else changes: the instances stay frozen (assignment still
raises ``FrozenInstanceError``), and equality, hashing, ``repr``, ``replace``, pickling and the
signature (positional order, keywords, defaults) are the dataclass's own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def slot_init(cls: type[T]) -> type[T]:
    """Class decorator, applied over ``@dataclass(frozen=True, slots=True)``."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if not getattr(cls, "__slots__", None) and fields:
        raise TypeError(f"{cls.__name__}: slot_init needs a dataclass with slots=True")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: slot_init does not call __post_init__")
    namespace: dict[str, Any] = {}
    params = []
    body = []
    for index, field in enumerate(fields):
        if not field.init or field.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{field.name}: slot_init supports plain fields and defaults only")
        if field.default is dataclasses.MISSING:
            params.append(field.name)
        else:
            namespace[f"_default_{index}"] = field.default
            params.append(f"{field.name}=_default_{index}")
        namespace[f"_set_{index}"] = cls.__dict__[field.name].__set__
        body.append(f"    _set_{index}(self, {field.name})\n")
    source = f"def __init__(self, {', '.join(params)}):\n" + ("".join(body) or "    pass\n")
    exec(source, namespace)  # built from the dataclass's own field names, as dataclasses does
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    setattr(cls, "__init__", init)  # noqa: B010 - a method replaced on the class, not an attribute set
    return cls
