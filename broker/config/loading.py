"""Loading the configuration: defaults < TOML file < ``SKIPMQ_*`` environment < command-line
overrides (``--set KEY=VALUE``), merged key by key, each value checked and the result built
into the frozen ``BrokerConfig`` (broker.config.schema). Unknown keys in the file or in
overrides are errors with the closest known key suggested, and so are unknown ``SKIPMQ_*``
environment variables, except Kubernetes service-link variables and the test tools' knobs
(``TOOL_ENV_PREFIXES``): those are listed in ``BrokerConfig.warnings`` for the broker to log.
"""

from __future__ import annotations

import os
import re
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from broker.config.schema import ENV_PREFIX, KEYS, SECTIONS, BrokerConfig
from broker.config.validation import (
    ConfigError,
    _bad_value,
    _check,
    _from_text,
    _suggest,
    _unknown_key_error,
    _validate_together,
)

CONFIG_FILE_ENV = "SKIPMQ_CONFIG"  # path of the TOML file when load_config(path=None)

_ENV_TO_KEY: dict[str, str] = {spec.env_var: name for name, spec in KEYS.items()}


def _flatten_file(data: Mapping[str, Any], prefix: str, source: str, out: dict[str, tuple[Any, str]]) -> None:
    for raw_key, value in data.items():
        name = prefix + raw_key
        if name in KEYS:
            if isinstance(value, dict):
                raise _bad_value(KEYS[name], value, source, f"must be {KEYS[name].allowed()}, not a table")
            out[name] = (value, source)
        elif name in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{name}: must be a table ([{name}]), got {value!r} (from {source})", key=name
                )
            _flatten_file(value, name + ".", source, out)
        else:
            while isinstance(value, dict) and len(value) == 1:  # [listener.tcp] port=1 -> listener.tcp.port
                ((leaf, value),) = value.items()
                name = f"{name}.{leaf}"
            raise _unknown_key_error(name, source)


def _read_file(path: str) -> dict[str, tuple[Any, str]]:
    source = f"file {path}"
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {path!r} is not valid TOML: {exc}") from None
    out: dict[str, tuple[Any, str]] = {}
    _flatten_file(data, "", source, out)
    return out


# Kubernetes service links ("<SERVICE>_SERVICE_HOST", "<SERVICE>_PORT=tcp://...", ...)
_SERVICE_LINK = re.compile(
    r"^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$"
)
_SERVICE_LINK_URL = re.compile(r"^(tcp|udp|sctp)://")


TOOL_ENV_PREFIXES = ("SKIPMQ_TEST_", "SKIPMQ_ZL_")  # the test suite's knobs, not broker keys


def _is_service_link(var: str, value: str) -> bool:
    if var.endswith("_PORT") and not var.endswith("_SERVICE_PORT"):
        return bool(_SERVICE_LINK_URL.match(value))  # SKIPMQ_PORT=tcp://10.0.0.1:1883
    return bool(_SERVICE_LINK.match(var))


def _read_env(env: Mapping[str, str]) -> tuple[dict[str, tuple[Any, str]], list[str]]:
    values: dict[str, tuple[Any, str]] = {}
    warnings: list[str] = []
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or var == CONFIG_FILE_ENV:
            continue
        name = _ENV_TO_KEY.get(var)
        if name is None:
            if var.startswith(TOOL_ENV_PREFIXES):
                warnings.append(f"ignored environment variable {var}: a test tool's setting, not a key")
                continue
            if not _is_service_link(var, env[var]):
                raise ConfigError(
                    f"unknown environment variable {var}: not a configuration key"
                    f"{_suggest(var, sorted(_ENV_TO_KEY))}",
                    key=var,
                )
            warnings.append(f"ignored environment variable {var}: a Kubernetes service link, not a key")
            continue
        source = f"environment variable {var}"
        values[name] = (_from_text(KEYS[name], env[var], source), source)
    return values, warnings


def parse_override(text: str) -> tuple[str, Any]:
    """Parse a ``--set KEY=VALUE`` argument into (dotted key, typed value)."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(f"--set expects KEY=VALUE (e.g. limits.max_queued_messages=10), got {text!r}")
    if name not in KEYS:
        raise _unknown_key_error(name, "--set")
    spec = KEYS[name]
    return name, _check(spec, _from_text(spec, raw, "--set"), "--set")


def _read_overrides(overrides: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    values: dict[str, tuple[Any, str]] = {}
    for name, value in overrides.items():
        if name not in KEYS:
            raise _unknown_key_error(name, "command-line overrides")
        spec = KEYS[name]
        source = f"command-line override {name}"
        if isinstance(value, str) and spec.kind is not str:
            value = _from_text(spec, value, source)
        values[name] = (value, source)
    return values


def _build(cls: type, prefix: str, flat: Mapping[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.metadata.get("internal"):
            continue
        kind = hints[f.name]
        if is_dataclass(kind):
            kwargs[f.name] = _build(typing.cast(type, kind), prefix + f.name + ".", flat)
        else:
            kwargs[f.name] = flat[prefix + f.name]
    return cls(**kwargs)


def load_config(
    path: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> BrokerConfig:
    """Load and validate the configuration.

    ``path``: TOML file (None: ``$SKIPMQ_CONFIG`` if set, else no file). ``env``: environment
    (None: ``os.environ``). ``overrides``: dotted key -> value from the command line; string values
    are converted like environment values.
    """
    environ = os.environ if env is None else env
    if path is None:
        path = environ.get(CONFIG_FILE_ENV) or None
    layered: dict[str, tuple[Any, str]] = {name: (spec.default, "defaults") for name, spec in KEYS.items()}
    if path is not None:
        layered.update(_read_file(path))
    env_values, warnings = _read_env(environ)
    layered.update(env_values)
    layered.update(_read_overrides(overrides or {}))

    flat = {name: _check(KEYS[name], value, source) for name, (value, source) in layered.items()}
    _validate_together(flat, {name: source for name, (_value, source) in layered.items()})
    config: BrokerConfig = _build(BrokerConfig, "", flat)
    return BrokerConfig(**{**_shallow(config), "warnings": tuple(warnings)})


def _shallow(config: BrokerConfig) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in fields(config)}


def config_to_flat(config: BrokerConfig) -> dict[str, Any]:
    """The effective configuration as dotted key -> value (e.g. to log it at startup)."""
    out: dict[str, Any] = {}
    for name in KEYS:
        value: Any = config
        for part in name.split("."):
            value = getattr(value, part)
        out[name] = value
    return out
