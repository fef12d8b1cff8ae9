"""The overlay's messages and the API's hot event/action classes write their ``__init__`` and
``kind`` out by hand (so that mypyc can compile them, ``overlay/messages.py``). These tests
hold the hand-written parts to what the dataclass declares: a field added without its
``__init__`` parameter, a parameter out of order, a wrong default or a ``kind`` that is not the
class name fails here, not on the wire."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any

import pytest

from overlay import api
from overlay import messages as m

MESSAGE_CLASSES = [
    cls
    for cls in vars(m).values()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == m.__name__
]
API_CLASSES = [api.Send, api.Receive, api.Tick]


def _sample(cls: type) -> Any:
    """An instance with a distinct value per field (by position)."""
    values = [(f"v{index}",) for index, _ in enumerate(dataclasses.fields(cls))]
    return cls(*values)


def test_every_message_kind_is_covered() -> None:
    assert len(MESSAGE_CLASSES) == 17
    assert {cls.__name__ for cls in MESSAGE_CLASSES} >= {"REXP", "EEXP", "PUB", "UNSUB", "NEW"}


@pytest.mark.parametrize("cls", MESSAGE_CLASSES + API_CLASSES, ids=lambda cls: cls.__name__)
def test_init_takes_the_fields_in_order_with_their_defaults(cls: type) -> None:
    fields = dataclasses.fields(cls)
    params = list(inspect.signature(cls).parameters.values())
    assert [p.name for p in params] == [f.name for f in fields]
    for param, field in zip(params, fields, strict=True):
        expected = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        assert param.default == expected, field.name


@pytest.mark.parametrize("cls", MESSAGE_CLASSES + API_CLASSES, ids=lambda cls: cls.__name__)
def test_instances_hold_what_was_given_and_stay_frozen(cls: type) -> None:
    message = _sample(cls)
    for index, field in enumerate(dataclasses.fields(cls)):
        assert getattr(message, field.name) == (f"v{index}",)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(message, field.name, None)
    assert message == _sample(cls) and hash(message) == hash(_sample(cls))
    assert pickle.loads(pickle.dumps(message)) == message
    if dataclasses.fields(cls):
        first = dataclasses.fields(cls)[0].name
        changed = dataclasses.replace(message, **{first: ("other",)})
        assert getattr(changed, first) == ("other",) and changed != message


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=lambda cls: cls.__name__)
def test_kind_is_the_class_name(cls: type) -> None:
    assert _sample(cls).kind == cls.__name__
