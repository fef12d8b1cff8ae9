"""Tests for broker.config: defaults, file, env and override precedence, and every kind of error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
from broker.config import (  # noqa: E402
    KEYS,
    BrokerConfig,
    ConfigError,
    config_to_flat,
    load_config,
    parse_override,
)


def write(tmp_path: Path, text: str, name: str = "skipmq.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_defaults() -> None:
    config = load_config(env={})
    assert config == BrokerConfig()
    assert config.node_id == ""
    assert config.data_dir == "./data"
    assert config.store.synchronous == "normal" and config.store.persistence is True
    assert config.store_path == "./data/skipmq.db"
    assert (config.listeners.tcp.enabled, config.listeners.tcp.host, config.listeners.tcp.port) == (
        True,
        "0.0.0.0",
        1883,
    )
    assert config.listeners.tls.enabled is False and config.listeners.tls.port == 8883
    assert config.listeners.websocket.port == 8080 and config.listeners.websocket.path == "/mqtt"
    assert (config.http.enabled, config.http.host, config.http.port) == (True, "127.0.0.1", 9090)
    assert config.auth.allow_anonymous is True
    limits = config.limits
    assert limits.max_packet_size_bytes == 1024 * 1024
    assert limits.receive_maximum == 100
    assert limits.max_inflight_messages == 20
    assert limits.max_queued_messages == 1000
    assert limits.queue_overflow == "drop_oldest"
    assert limits.max_keepalive_s == 0
    assert limits.topic_alias_maximum == 10
    assert limits.max_session_expiry_s == 7 * 86400
    assert limits.maximum_qos == 2
    assert limits.retain_available is True
    assert limits.max_client_id_length == 65535
    assert limits.max_connections == 0
    assert config.sys.interval_s == 10
    assert (config.logging.level, config.logging.format) == ("info", "json")
    assert config.warnings == ()


def test_config_is_frozen() -> None:
    config = load_config(env={})
    with pytest.raises(AttributeError):
        config.node_id = "x"  # type: ignore[misc]


def test_file_values(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        node_id = "n1"
        data_dir = "/var/lib/skipmq"
        [store]
        path = "/tmp/x.db"
        synchronous = "full"
        [listeners.tcp]
        port = 0
        [listeners.websocket]
        enabled = true
        path = "/ws"
        [limits]
        max_queued_messages = 5
        queue_overflow = "drop_new"
        [logging]
        format = "text"
        """,
    )
    config = load_config(path, env={})
    assert config.node_id == "n1"
    assert config.store_path == "/tmp/x.db"
    assert config.store.synchronous == "full"
    assert config.listeners.tcp.port == 0
    assert config.listeners.websocket.enabled and config.listeners.websocket.path == "/ws"
    assert config.limits.max_queued_messages == 5
    assert config.limits.queue_overflow == "drop_new"
    assert config.logging.format == "text"
    assert config.limits.receive_maximum == 100  # untouched keys keep defaults


def test_precedence_defaults_file_env_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path, "[listeners.tcp]\nport = 1000\n[limits]\nmax_queued_messages = 1\nmaximum_qos = 1\n"
    )
    env = {"SKIPMQ_LISTENERS_TCP_PORT": "2000", "SKIPMQ_LIMITS_MAX_QUEUED_MESSAGES": "2"}
    config = load_config(path, env=env, overrides={"listeners.tcp.port": 3000})
    assert config.listeners.tcp.port == 3000  # override beats env beats file
    assert config.limits.max_queued_messages == 2  # env beats file
    assert config.limits.maximum_qos == 1  # file beats default
    assert config.limits.receive_maximum == 100  # default


def test_env_types_and_bool_words() -> None:
    for word, expected in [
        ("true", True),
        ("1", True),
        ("YES", True),
        ("false", False),
        ("0", False),
        ("no", False),
    ]:
        config = load_config(env={"SKIPMQ_AUTH_ALLOW_ANONYMOUS": word})
        assert config.auth.allow_anonymous is expected, word
    config = load_config(
        env={"SKIPMQ_NODE_ID": "node-a", "SKIPMQ_DATA_DIR": "/d", "SKIPMQ_SYS_INTERVAL_S": " 0 "}
    )
    assert (config.node_id, config.data_dir, config.sys.interval_s) == ("node-a", "/d", 0)
    assert config.store_path == "/d/skipmq.db"


def test_config_file_from_env(tmp_path: Path) -> None:
    path = write(tmp_path, "node_id = 'from-file'\n")
    assert load_config(env={"SKIPMQ_CONFIG": path}).node_id == "from-file"


def test_overrides_accept_strings_like_the_cli() -> None:
    config = load_config(env={}, overrides={"limits.max_inflight_messages": "7", "http.enabled": "no"})
    assert config.limits.max_inflight_messages == 7
    assert config.http.enabled is False


def test_parse_override() -> None:
    assert parse_override("limits.max_queued_messages=10") == ("limits.max_queued_messages", 10)
    assert parse_override("listeners.tls.enabled=yes") == ("listeners.tls.enabled", True)
    assert parse_override("node_id=a=b") == ("node_id", "a=b")
    assert parse_override(" store.path = ") == ("store.path", " ")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("limits.max_queued_messages")
    with pytest.raises(ConfigError, match=r"did you mean 'limits\.max_queued_messages'"):
        parse_override("limits.max_queue_messages=3")
    expected = r"limits\.maximum_qos: must be an integer in 0\.\.2, got 3 \(from --set\)"
    with pytest.raises(ConfigError, match=expected):
        parse_override("limits.maximum_qos=3")
    key, value = parse_override("limits.maximum_qos=1")
    assert load_config(env={}, overrides={key: value}).limits.maximum_qos == 1


@pytest.mark.parametrize(
    ("source", "key", "value", "expected"),
    [
        (
            "file",
            "listeners.tcp.port",
            "70000",
            r"listeners\.tcp\.port: must be an integer in 0\.\.65535, got 70000",
        ),
        ("file", "listeners.tcp.port", "-1", r"listeners\.tcp\.port: .*0\.\.65535, got -1"),
        ("file", "listeners.tcp.port", '"1883"', r"listeners\.tcp\.port: must be an integer.*got '1883'"),
        ("file", "listeners.tcp.port", "true", r"listeners\.tcp\.port: must be an integer.*got True"),
        ("file", "listeners.tcp.port", "1.5", r"listeners\.tcp\.port: must be an integer.*got 1\.5"),
        ("file", "limits.receive_maximum", "0", r"limits\.receive_maximum: .*1\.\.65535, got 0"),
        ("file", "limits.max_packet_size_bytes", "268435456", r"max_packet_size_bytes: .*1\.\.268435455"),
        ("file", "limits.maximum_qos", "3", r"limits\.maximum_qos: .*0\.\.2, got 3"),
        (
            "file",
            "limits.queue_overflow",
            '"drop_all"',
            r"queue_overflow: must be one of 'drop_oldest', 'drop_new'",
        ),
        ("file", "logging.level", '"verbose"', r"logging\.level: must be one of 'debug', 'info'"),
        ("file", "logging.format", '"xml"', r"logging\.format: must be one of 'json', 'text', got 'xml'"),
        ("file", "store.synchronous", '"off"', r"store\.synchronous: must be one of 'normal', 'full'"),
        ("file", "auth.allow_anonymous", '"yes"', r"auth\.allow_anonymous: must be a boolean.*got 'yes'"),
        ("file", "node_id", "5", r"node_id: must be a string, got 5"),
        ("file", "node_id", '"has space"', r"node_id: must be 1\.\.128 characters"),
        ("file", "listeners.websocket.path", '"mqtt"', r"listeners\.websocket\.path: must start with '/'"),
        ("file", "http.host", '""', r"http\.host: must not be empty"),
        ("file", "data_dir", '""', r"data_dir: must not be empty"),
        ("env", "SKIPMQ_LISTENERS_TCP_PORT", "abc", r"listeners\.tcp\.port: must be an integer.*'abc'"),
        ("env", "SKIPMQ_LIMITS_MAX_QUEUED_MESSAGES", "-5", r"max_queued_messages: .*got -5"),
        ("env", "SKIPMQ_LIMITS_MAX_QUEUED_MESSAGES", "0", r"max_queued_messages: .*1\.\.2147483647, got 0"),
        (
            "env",
            "SKIPMQ_STORE_PERSISTENCE",
            "maybe",
            r"store\.persistence: must be one of true/false/1/0/yes/no",
        ),
        (
            "override",
            "limits.max_inflight_messages",
            0,
            r"limits\.max_inflight_messages: .*1\.\.65535, got 0",
        ),
        ("override", "http.enabled", "perhaps", r"http\.enabled: must be one of true/false"),
        ("override", "sys.interval_s", 3.5, r"sys\.interval_s: must be an integer.*got 3\.5"),
        ("override", "node_id", 7, r"node_id: must be a string, got 7"),
    ],
)
def test_bad_values_name_key_value_and_allowed(
    tmp_path: Path, source: str, key: str, value: Any, expected: str
) -> None:
    path = None
    env: dict[str, str] = {}
    overrides: dict[str, Any] = {}
    if source == "file":
        section, _, leaf = key.rpartition(".")
        text = (f"[{section}]\n" if section else "") + f"{leaf} = {value}\n"
        path = write(tmp_path, text)
    elif source == "env":
        env[key] = value
    else:
        overrides[key] = value
    with pytest.raises(ConfigError, match=expected) as info:
        load_config(path, env=env, overrides=overrides)
    assert info.value.key  # the offending dotted key is also available programmatically
    # The message says where the value came from.
    origin = {"file": "file ", "env": "environment variable ", "override": "command-line override"}[source]
    assert origin in str(info.value)


def test_unknown_file_key_suggests_closest(tmp_path: Path) -> None:
    path = write(tmp_path, "[limits]\nmax_queue_messages = 3\n")
    with pytest.raises(
        ConfigError,
        match=r"unknown configuration key 'limits\.max_queue_messages'.*"
        r"did you mean 'limits\.max_queued_messages'",
    ):
        load_config(path, env={})


def test_unknown_section_and_top_level_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'listener\.tcp\.port'.*did you mean 'listeners\.tcp\.port'"):
        load_config(write(tmp_path, "[listener.tcp]\nport = 1\n"), env={})
    with pytest.raises(ConfigError, match=r"unknown configuration key 'nodeid'.*did you mean 'node_id'"):
        load_config(write(tmp_path, "nodeid = 'x'\n"), env={})
    with pytest.raises(ConfigError, match=r"unknown configuration key 'tcp\.port'.*'listeners\.tcp\.port'"):
        load_config(env={}, overrides={"tcp.port": 1})


def test_section_given_as_value_and_key_given_as_table(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"limits: must be a table"):
        load_config(write(tmp_path, "limits = 5\n"), env={})
    with pytest.raises(ConfigError, match=r"node_id: must be a string, not a table"):
        load_config(write(tmp_path, "[node_id]\nx = 1\n"), env={})


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.toml"), env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[limits\nx = 1\n"), env={})


def test_unknown_env_vars_are_refused_with_the_closest_name() -> None:
    with pytest.raises(
        ConfigError, match=r"SKIPMQ_LISTENER_TCP_PORT.*did you mean 'SKIPMQ_LISTENERS_TCP_PORT'"
    ):
        load_config(env={"SKIPMQ_LISTENER_TCP_PORT": "1", "OTHER": "x"})
    with pytest.raises(ConfigError, match=r"SKIPMQ_CLUSTER_JION.*'SKIPMQ_CLUSTER_JOIN'"):
        load_config(env={"SKIPMQ_CLUSTER_JION": "a:1"})
    with pytest.raises(ConfigError, match="SKIPMQ_PORT"):  # not a service link: a plain number
        load_config(env={"SKIPMQ_PORT": "1884"})


def test_kubernetes_service_link_env_vars_are_warnings_not_errors() -> None:
    # Kubernetes service links inject SKIPMQ_PORT etc. for services named "skipmq", "skipmq-peers"
    env = {
        "SKIPMQ_PORT": "tcp://10.0.0.1:1883",
        "SKIPMQ_SERVICE_HOST": "10.0.0.1",
        "SKIPMQ_SERVICE_PORT_MQTT": "1883",
        "SKIPMQ_PEERS_PORT_7883_TCP_ADDR": "10.0.0.2",
        "SKIPMQ_ZL_MESSAGES": "100",  # a test tool's knob, inherited by the brokers it starts
        "OTHER": "x",
    }
    config = load_config(env=env)
    assert config.listeners.tcp.port == 1883
    assert len(config.warnings) == 5 and sum("service link" in w for w in config.warnings) == 4


def test_tls_enabled_requires_cert_and_key(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"listeners\.tls\.enabled: .*listeners\.tls\.certfile and "
        r"listeners\.tls\.keyfile are not set",
    ):
        load_config(env={}, overrides={"listeners.tls.enabled": True})
    cert = write(tmp_path, "cert", "server.crt")
    with pytest.raises(ConfigError, match=r"listeners\.tls\.keyfile is not set"):
        load_config(env={}, overrides={"listeners.tls.enabled": True, "listeners.tls.certfile": cert})
    with pytest.raises(ConfigError, match=r"listeners\.tls\.keyfile: file '.*nope\.key' does not exist"):
        load_config(
            env={},
            overrides={
                "listeners.tls.enabled": True,
                "listeners.tls.certfile": cert,
                "listeners.tls.keyfile": str(tmp_path / "nope.key"),
            },
        )
    key = write(tmp_path, "key", "server.key")
    tls = {"listeners.tls.enabled": True, "listeners.tls.certfile": cert, "listeners.tls.keyfile": key}
    config = load_config(env={}, overrides=tls)
    assert config.listeners.tls.enabled and config.listeners.tls.certfile == cert
    with pytest.raises(ConfigError, match=r"require_client_cert: requires listeners\.tls\.cafile"):
        load_config(env={}, overrides={**tls, "listeners.tls.require_client_cert": True})
    with pytest.raises(ConfigError, match=r"use_identity_as_username: requires listeners\.tls\.cafile"):
        load_config(env={}, overrides={**tls, "listeners.tls.use_identity_as_username": True})
    with pytest.raises(ConfigError, match=r"identity_field"):
        load_config(env={}, overrides={**tls, "listeners.tls.identity_field": "serial"})
    # Disabled TLS does not check certificate files.
    assert not load_config(env={}, overrides={"listeners.tls.certfile": "/nonexistent"}).listeners.tls.enabled


def test_auth_files_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"auth\.password_file: file '/no/such/passwd' does not exist"):
        load_config(env={"SKIPMQ_AUTH_PASSWORD_FILE": "/no/such/passwd"})
    with pytest.raises(ConfigError, match=r"auth\.acl_file: file"):
        load_config(env={}, overrides={"auth.acl_file": str(tmp_path / "acl")})
    acl = write(tmp_path, "topic readwrite #\n", "acl")
    assert load_config(env={}, overrides={"auth.acl_file": acl}).auth.acl_file == acl


def test_port_conflicts_are_detected_but_zero_is_fine() -> None:
    with pytest.raises(ConfigError, match=r"http\.port: port 1883 is also used by listeners\.tcp\.port"):
        load_config(env={}, overrides={"http.port": 1883})
    # Different specific hosts may share a port; ephemeral ports never conflict.
    load_config(
        env={},
        overrides={"listeners.tcp.host": "127.0.0.2", "http.port": 1883, "http.host": "127.0.0.1"},
    )
    config = load_config(env={}, overrides={"listeners.tcp.port": 0, "http.port": 0})
    assert (config.listeners.tcp.port, config.http.port) == (0, 0)


def test_every_key_round_trips_through_flat_view_and_env() -> None:
    flat = config_to_flat(load_config(env={}))
    assert set(flat) == set(KEYS)
    assert all(flat[name] == spec.default for name, spec in KEYS.items())
    assert KEYS["listeners.tcp.port"].env_var == "SKIPMQ_LISTENERS_TCP_PORT"
    assert KEYS["limits.max_queued_messages"].env_var == "SKIPMQ_LIMITS_MAX_QUEUED_MESSAGES"


def test_documentation_lists_every_key_and_env_var() -> None:
    text = (REPO_ROOT / "docs" / "configuration.md").read_text()
    missing = [name for name, spec in KEYS.items() if f"`{name}`" not in text or spec.env_var not in text]
    assert missing == []


def test_memory_low_water_mark_must_be_below_the_high_one() -> None:
    with pytest.raises(ConfigError, match=r"limits\.memory_low_water_bytes: must be below"):
        load_config(
            env={},
            overrides={"limits.memory_high_water_bytes": 1000, "limits.memory_low_water_bytes": 1000},
        )
    with pytest.raises(ConfigError, match=r"limits\.memory_low_water_bytes: must be below"):
        load_config(env={}, overrides={"limits.memory_low_water_bytes": 1000})
    config = load_config(env={}, overrides={"limits.memory_high_water_bytes": 1000})
    assert config.limits.memory_low_water_bytes == 0  # 80% of the high-water mark (memory_guard.py)
