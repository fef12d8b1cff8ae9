"""Validated broker configuration: defaults < TOML file < environment < CLI overrides.

Every key is a field of a frozen dataclass; its type, default, range or allowed values live in
the field's metadata, the single source for validation, environment variable names
(``SKIPMQ_<DOTTED_KEY_UPPERCASED_WITH_UNDERSCORES>``) and the reference in
docs/configuration.md (a test checks the document lists every key). Errors raise
``ConfigError`` naming the dotted key, the bad value, where it came from and what is allowed.

The package is split by concern; ``broker.config`` exports every public name:

* ``broker.config.schema``: the section dataclasses, ``BrokerConfig``, ``KeySpec``, ``KEYS``,
  ``SECTIONS``, ``ENV_PREFIX``;
* ``broker.config.loading``: ``load_config`` (TOML file, ``SKIPMQ_*`` environment, overrides,
  merging), ``parse_override``, ``config_to_flat``, ``CONFIG_FILE_ENV``, ``TOOL_ENV_PREFIXES``;
* ``broker.config.validation``: ``ConfigError``, per-key and cross-key checks,
  ``validate_cluster_links``, ``validate_federation_links``.
"""

from __future__ import annotations

from broker.config.loading import (
    CONFIG_FILE_ENV,
    TOOL_ENV_PREFIXES,
    config_to_flat,
    load_config,
    parse_override,
)
from broker.config.schema import (
    ENV_PREFIX,
    KEYS,
    SECTIONS,
    AdminConfig,
    AuthConfig,
    BrokerConfig,
    ClusterConfig,
    FederationConfig,
    HttpConfig,
    KeySpec,
    LimitsConfig,
    ListenersConfig,
    LoggingConfig,
    PullConfig,
    StoreConfig,
    SysConfig,
    TcpListenerConfig,
    TlsListenerConfig,
    WebSocketListenerConfig,
)
from broker.config.validation import ConfigError, validate_cluster_links, validate_federation_links

__all__ = [
    "CONFIG_FILE_ENV",
    "ENV_PREFIX",
    "KEYS",
    "SECTIONS",
    "TOOL_ENV_PREFIXES",
    "AdminConfig",
    "AuthConfig",
    "BrokerConfig",
    "ClusterConfig",
    "ConfigError",
    "FederationConfig",
    "HttpConfig",
    "KeySpec",
    "LimitsConfig",
    "ListenersConfig",
    "LoggingConfig",
    "PullConfig",
    "StoreConfig",
    "SysConfig",
    "TcpListenerConfig",
    "TlsListenerConfig",
    "WebSocketListenerConfig",
    "config_to_flat",
    "load_config",
    "parse_override",
    "validate_cluster_links",
    "validate_federation_links",
]
