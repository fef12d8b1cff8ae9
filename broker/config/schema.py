"""The configuration schema: one frozen dataclass per section, every key a field whose metadata
holds its help, default, range or allowed values, and the key table derived from them
(``KEYS``, ``SECTIONS``, ``KeySpec``). This is the single source the loader and validation
(broker.config.loading, broker.config.validation), the environment variable names, the Helm
chart's values schema (scripts/gen_chart_schema.py) and docs/configuration.md (a test checks
the document lists every key) read.

Size: one frozen dataclass per configuration section with every key's help, range and default,
about 110 keys; splitting the sections apart would scatter that one table.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

ENV_PREFIX = "SKIPMQ_"

_UINT32_MAX = 4_294_967_295


def _key(
    default: Any,
    doc: str,
    *,
    min_value: int | None = None,
    max_value: int | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A configuration field: default plus validation metadata."""
    return field(
        default=default,
        metadata={"doc": doc, "min": min_value, "max": max_value, "choices": choices},
    )


# --- the configuration schema --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreConfig:
    path: str = _key("", 'SQLite database file; "" means <data_dir>/skipmq.db')
    synchronous: str = _key(
        "normal",
        "SQLite synchronous mode: normal (a process crash loses nothing committed; power loss may "
        "lose the last commits) or full (fsync per commit, survives power loss)",
        choices=("normal", "full"),
    )
    checkpoint: str = _key(
        "background",
        "where WAL checkpoints run: background (a thread of the store; a COMMIT on the event loop "
        "checkpoints only when the WAL reaches 10,000 pages) or inline (SQLite's automatic "
        "checkpoint inside the COMMIT every 1,000 pages)",
        choices=("background", "inline"),
    )
    persistence: bool = _key(True, "keep persistent sessions, queues and retained messages in the store")


@dataclass(frozen=True, slots=True)
class TcpListenerConfig:
    enabled: bool = _key(True, "accept plain MQTT over TCP")
    host: str = _key("0.0.0.0", "address to bind")
    port: int = _key(1883, "TCP port (0 = an ephemeral port)", min_value=0, max_value=65535)


@dataclass(frozen=True, slots=True)
class TlsListenerConfig:
    enabled: bool = _key(False, "accept MQTT over TLS (requires certfile and keyfile)")
    host: str = _key("0.0.0.0", "address to bind")
    port: int = _key(8883, "TLS port (0 = an ephemeral port)", min_value=0, max_value=65535)
    certfile: str = _key("", "PEM server certificate (chain)")
    keyfile: str = _key("", "PEM private key of certfile")
    cafile: str = _key("", "PEM CA bundle to verify client certificates")
    require_client_cert: bool = _key(
        False,
        "require a client certificate signed by cafile (false with cafile set: a certificate is "
        "optional, but one that is presented must verify)",
    )
    use_identity_as_username: bool = _key(
        False,
        "a client with a verified certificate is authenticated by it: its identity "
        "(listeners.tls.identity_field) is the MQTT user name, the CONNECT's user name and password "
        "are ignored; without require_client_cert, clients without a certificate use the password "
        "file as on TCP",
    )
    identity_field: str = _key(
        "cn",
        "which part of the client certificate is the user name: cn (subject common name), "
        "san_dns, san_email or san_uri (the first subject alternative name of that type); a "
        "certificate without it is refused with 0x87",
        choices=("cn", "san_dns", "san_email", "san_uri"),
    )


@dataclass(frozen=True, slots=True)
class WebSocketListenerConfig:
    enabled: bool = _key(False, 'accept MQTT over WebSocket (subprotocol "mqtt")')
    host: str = _key("0.0.0.0", "address to bind")
    port: int = _key(8080, "WebSocket port (0 = an ephemeral port)", min_value=0, max_value=65535)
    path: str = _key("/mqtt", "HTTP path of the WebSocket endpoint (starts with /)")


@dataclass(frozen=True, slots=True)
class ListenersConfig:
    tcp: TcpListenerConfig = field(default_factory=TcpListenerConfig)
    tls: TlsListenerConfig = field(default_factory=TlsListenerConfig)
    websocket: WebSocketListenerConfig = field(default_factory=WebSocketListenerConfig)


@dataclass(frozen=True, slots=True)
class HttpConfig:
    enabled: bool = _key(True, "serve GET /metrics (Prometheus) and GET /healthz")
    host: str = _key("127.0.0.1", "address to bind")
    port: int = _key(9090, "HTTP port (0 = an ephemeral port)", min_value=0, max_value=65535)
    certfile: str = _key("", "PEM server certificate (chain): set with keyfile to serve HTTPS")
    keyfile: str = _key("", "PEM private key of certfile")
    cafile: str = _key("", "PEM CA bundle to verify client certificates (optional)")
    header_timeout_s: int = _key(
        10,
        "a connection that has not sent a whole request's headers this long after it opened or after"
        " its previous response is closed (slowloris guard and keep-alive idle timeout); a /v1/* body must"
        " also arrive within this time (else 408)",
        min_value=1,
        max_value=3600,
    )


@dataclass(frozen=True, slots=True)
class AdminConfig:
    enabled: bool = _key(
        False,
        "serve the admin API /admin/v1/* and the web console /console/ on the HTTP listener "
        "(docs/operations.md); needs admin.users_file",
    )
    users_file: str = _key(
        "",
        "admin users, one name:role:hash per line (role admin or readonly), made with "
        "`skipmq ctl admin-user`; separate from the MQTT users",
    )
    advertise_url: str = _key(
        "",
        'the URL other brokers reach this broker\'s admin API at; "" = http(s)://<http.host, or '
        "cluster.advertise_host when http.host is a wildcard>:<http port>",
    )
    fanout_timeout_ms: int = _key(
        3000,
        "how long a cluster-wide admin answer waits for each other broker's part (a broker that "
        "does not answer in time is named in the answer)",
        min_value=100,
        max_value=60000,
    )
    peer_cafile: str = _key(
        "",
        "PEM CA bundle to verify other brokers' HTTPS admin endpoints; \"\" = the system's trust store",
    )
    console: bool = _key(True, "serve the web console at /console/ (with admin.enabled)")


@dataclass(frozen=True, slots=True)
class PullConfig:
    enabled: bool = _key(False, "serve the HTTP pull gateway /v1/* on the HTTP listener (docs/pull.md)")
    max_body_bytes: int = _key(
        65536, "largest request body of /v1/* (413 names this key)", min_value=1024, max_value=16777216
    )
    max_wait_s: int = _key(
        30, "longest long-poll a client may ask for in POST /v1/pull", min_value=0, max_value=300
    )
    requests_per_s: int = _key(
        50,
        "authenticated requests per second per client id (bucket of the same size; 429 names this key)",
        min_value=1,
    )
    failures_per_s: int = _key(
        10,
        "refused requests (bad credentials, malformed) per second per source address; beyond it the"
        " address gets 429 naming this key before its credentials are checked",
        min_value=1,
    )
    lease_s: int = _key(
        30,
        "a pull session stays attached (receiving into its buffer) this long after its last request",
        min_value=1,
        max_value=3600,
    )
    session_expiry_s: int = _key(
        86400, "session expiry of a pull session when the request does not give one", min_value=1
    )


@dataclass(frozen=True, slots=True)
class AuthConfig:
    allow_anonymous: bool = _key(True, "accept clients that send no username")
    password_file: str = _key("", "password file (skipmq passwd); must exist when set")
    acl_file: str = _key("", "ACL file; must exist when set")


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_packet_size_bytes: int = _key(
        1_048_576,
        "largest MQTT packet accepted (larger: DISCONNECT 0x95)",
        min_value=1,
        max_value=268_435_455,
    )
    receive_maximum: int = _key(
        100,
        "QoS>0 PUBLISH a client may have unacknowledged towards the broker (MQTT 5 Receive Maximum)",
        min_value=1,
        max_value=65535,
    )
    max_inflight_messages: int = _key(
        20,
        "outgoing QoS>0 window per client (capped by the client's receive maximum)",
        min_value=1,
        max_value=65535,
    )
    max_queued_messages: int = _key(
        1000,
        "QoS>0 messages queued per client beyond the in-flight window",
        min_value=1,
        max_value=2**31 - 1,
    )
    queue_overflow: str = _key(
        "drop_oldest", "what a full queue does with a new message", choices=("drop_oldest", "drop_new")
    )
    max_keepalive_s: int = _key(
        0,
        "0 = accept the client's keep alive; else the server keep alive caps it",
        min_value=0,
        max_value=65535,
    )
    topic_alias_maximum: int = _key(
        10, "topic aliases a client may use towards the broker (0 = none)", min_value=0, max_value=65535
    )
    max_session_expiry_s: int = _key(
        604_800,
        "cap on session expiry, also for MQTT 3.1.1 persistent sessions (0 = no cap)",
        min_value=0,
        max_value=_UINT32_MAX,
    )
    maximum_qos: int = _key(2, "highest QoS granted and accepted", min_value=0, max_value=2)
    retain_available: bool = _key(True, "accept retained messages")
    max_client_id_length: int = _key(
        65535, "longest client identifier accepted", min_value=23, max_value=65535
    )
    max_connections: int = _key(
        0, "concurrent client connections (0 = unlimited)", min_value=0, max_value=2**31 - 1
    )
    connect_timeout_s: int = _key(
        10, "seconds a new connection has to send CONNECT", min_value=1, max_value=3600
    )
    max_connect_packet_bytes: int = _key(
        65_536,
        "largest packet accepted before a CONNECT succeeded (the CONNECT itself and what is "
        "pipelined behind it; larger: CONNACK 0x95); caps the memory of unauthenticated sockets",
        min_value=64,
        max_value=268_435_455,
    )
    max_connections_per_ip: int = _key(
        0,
        "concurrent sockets from one IP address (0 = unlimited); beyond: CONNACK 0x97 Quota exceeded",
        min_value=0,
        max_value=2**31 - 1,
    )
    connect_rate_per_ip: int = _key(
        0,
        "new connections per second from one IP address, bursts up to twice that (0 = unlimited); "
        "beyond: CONNACK 0x9F Connection rate exceeded",
        min_value=0,
        max_value=1_000_000,
    )
    max_publish_rate: int = _key(
        0,
        "PUBLISH packets per second one connection may send, bursts up to twice that (0 = "
        "unlimited); beyond: DISCONNECT 0x96 Message rate too high (3.1.1: closed)",
        min_value=0,
        max_value=10_000_000,
    )
    max_output_buffer_bytes: int = _key(
        4_194_304,
        "slow consumers: a client whose unsent output is above this gets no QoS 0 messages "
        "(dropped, counted as reason slow_consumer); QoS 1/2 wait in its session queue",
        min_value=1024,
        max_value=2**31 - 1,
    )
    memory_high_water_bytes: int = _key(
        0,
        "the broker process's resident memory (RSS) above which it refuses new connections "
        "(CONNACK 0x89 Server busy), drops incoming QoS 0 PUBLISHes (counted as reason "
        "memory_high_water) and stops reading from clients that publish QoS 1/2, until RSS is "
        "below limits.memory_low_water_bytes (0 = off; docs/security.md)",
        min_value=0,
        max_value=2**62,
    )
    memory_low_water_bytes: int = _key(
        0,
        "RSS below which the broker recovers from the memory high-water mark (0 = 80% of "
        "limits.memory_high_water_bytes)",
        min_value=0,
        max_value=2**62,
    )
    memory_trim_heap: bool = _key(
        True,
        "while above limits.memory_high_water_bytes, ask glibc to return freed heap memory to the "
        "system (malloc_trim) before each RSS reading, so that RSS falls when buffers are freed",
    )
    memory_check_interval_ms: int = _key(
        500,
        "how often RSS is read (/proc/self/statm) while a memory high-water mark is set",
        min_value=10,
        max_value=60_000,
    )


@dataclass(frozen=True, slots=True)
class SysConfig:
    interval_s: int = _key(
        10, "seconds between $SYS publications (0 disables $SYS)", min_value=0, max_value=86400
    )


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    level: str = _key("info", "log level", choices=("debug", "info", "warning", "error"))
    format: str = _key("json", "json (one object per line) or text", choices=("json", "text"))
    dropped_messages_interval_s: int = _key(
        10,
        "at most one messages_dropped warning per client per this many seconds (the rest are summed)",
        min_value=1,
        max_value=86400,
    )


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    enabled: bool = _key(
        False, "join a SkipMQ cluster (the overlay over gRPC); --join or --cluster-port set it"
    )
    host: str = _key("127.0.0.1", "address the cluster gRPC listener binds")
    port: int = _key(7883, "cluster gRPC port (0 = an ephemeral port)", min_value=0, max_value=65535)
    advertise_host: str = _key(
        "", 'host other brokers dial to reach this one; "" = cluster.host (or the hostname if it is 0.0.0.0)'
    )
    join: str = _key(
        "",
        "comma-separated host:port of brokers to join through; a DNS name resolving to several "
        "addresses (Kubernetes headless service) contacts each of them",
    )
    class_levels: int = _key(
        1,
        "topic levels that form a topic class, the overlay's routing unit (docs/cluster.md)",
        min_value=1,
        max_value=16,
    )
    table_size: int = _key(
        60, "L: routing-table entries per overlay virtual node (seed 003 §3.3)", min_value=2, max_value=10_000
    )
    class_snapshot_interval_s: int = _key(
        10,
        "seconds between the per-class snapshots published locally on $SYS/skipmq/<broker-id>/classes "
        "(docs/pipeline.md; 0 disables them)",
        min_value=0,
        max_value=86400,
    )
    takeover_wait_ms: int = _key(
        500,
        "longest a CONNECT with clean start 0 waits for another broker to hand over the session",
        min_value=0,
        max_value=60_000,
    )
    publish_ack_wait_ms: int = _key(
        5000,
        "longest the overlay waits for a forwarded publication's completion (every subscriber "
        "broker stored it) before the send log publishes it again; PUBACKs never wait for it",
        min_value=0,
        max_value=600_000,
    )
    reorder_hold_ms: int = _key(
        200,
        "how long a forwarded message waits for an earlier one of its stream before the receiver "
        "asks the sender for it (RET); a gap is never skipped on a timer",
        min_value=0,
        max_value=600_000,
    )
    retransmit_ms: int = _key(
        1000,
        "the send log resends what a receiver broker has not acknowledged, and a receiver repeats "
        "its RET, after this long",
        min_value=10,
        max_value=600_000,
    )
    ack_delay_ms: int = _key(
        20,
        "a receiver broker acknowledges its streams this long after the first change, and holds "
        "the overlay's per-hop ACK and DONE of what it received as long, to send them all in one "
        "frame (0: each at once)",
        min_value=0,
        max_value=60_000,
    )
    send_log_retention_s: int = _key(
        3600,
        "a receiver broker silent this long (removed from the cluster) is given up: the send log "
        "stops keeping messages for it (counted in skipmq_cluster_receivers_given_up_total)",
        min_value=1,
        max_value=30 * 86400,
    )
    send_log_min_retention_ms: int = _key(
        10000,
        "a QoS>=1 message stays in the send log at least this long after it was delivered everywhere "
        "known, for a receiver broker that was cut off before the sender learned of it",
        min_value=0,
        max_value=3_600_000,
    )
    local_qos1_in_memory: bool = _key(
        False,
        "a QoS>=1 publish that only local subscribers receive (every known broker connected) is "
        "acknowledged without a send-log commit: faster, but an unnoticed partition plus a crash of "
        "this broker can lose it for a broker that subscribed meanwhile (docs/cluster.md)",
    )
    presence_grace_ms: int = _key(
        2000,
        "messages of a class without subscribers are kept this long and forwarded if a subscription "
        "appears meanwhile (the rendezvous point's notification delay)",
        min_value=0,
        max_value=600_000,
    )
    retained_anti_entropy_ms: int = _key(
        2000,
        "every this long a broker compares a digest of its retained versions with the next peer "
        "and copies the peer's retained store when they differ (0 = off)",
        min_value=0,
        max_value=3_600_000,
    )
    subscribe_wait_ms: int = _key(
        3000,
        "longest a SUBACK (and the CONNACK of a session that moved here) waits for its topic classes "
        "to be reachable in the overlay",
        min_value=0,
        max_value=600_000,
    )
    causal_groups: str = _key(
        "",
        "comma-separated MQTT topic filters whose messages are delivered in causal order at every "
        "broker (seed 004's CO service; set the same on every broker, docs/cluster.md)",
    )
    causal_wait_ms: int = _key(
        30000,
        "longest a message of a causal group waits for one it depends on whose broker does not "
        "answer (then delivered without it, counted in skipmq_cluster_causal_given_up_total)",
        min_value=1,
        max_value=3_600_000,
    )
    ping_interval_ms: int = _key(
        2000, "liveness probe period of overlay neighbours", min_value=100, max_value=600_000
    )
    failure_timeout_ms: int = _key(
        6000,
        "silence after which a neighbour broker is declared crashed (> ping_interval_ms)",
        min_value=200,
        max_value=3_600_000,
    )
    tls_ca_file: str = _key(
        "", "PEM cluster CA (skipmq certs init): peers must present a certificate it signed"
    )
    tls_cert_file: str = _key(
        "", "PEM certificate of this broker naming its peer id (skipmq certs issue); re-read when it changes"
    )
    tls_key_file: str = _key("", "PEM private key of cluster.tls_cert_file")
    insecure: bool = _key(
        False,
        "plaintext, unauthenticated cluster links (anyone reaching the cluster port is a broker); "
        "without it a clustered broker needs cluster.tls_ca_file, tls_cert_file and tls_key_file",
    )
    origin_proofs: str = _key(
        "required",
        "what this broker originates (stream items, retained updates, claims, directed messages) is "
        "signed with the key of cluster.tls_cert_file and checked by every receiver: 'required' "
        "refuses items without a valid proof, 'optional' only invalid ones (a rolling upgrade from "
        "a version without proofs), 'off' signs and checks nothing (always off with cluster.insecure); "
        "the same for this broker's dials: the answering broker must sign the Hello challenge with a "
        "certificate naming the dialed peer id ('required': refused if it does not answer, 'optional': "
        "only if it answers wrongly, 'off': not asked), and for its federation link requests (the "
        "parent's LinkAccepted must answer the challenge with a federation certificate naming the "
        "dialed name)",
        choices=("required", "optional", "off"),
    )
    max_frame_bytes: int = _key(
        67_108_864,
        "largest gRPC message (frame of items) sent or accepted on a cluster link; a larger one "
        "closes that link only",
        min_value=65_536,
        max_value=2**31 - 1,
    )
    max_batch_items: int = _key(
        256,
        "items per frame sent; a received frame with more closes that link only (set the same "
        "on every broker)",
        min_value=1,
        max_value=1_000_000,
    )
    link_runtime: str = _key(
        "h2",
        "the gRPC runtime of the cluster links: 'h2' (SkipMQ's own on the event loop, no thread hop "
        "per message) or 'grpcio' (grpc.aio); the same protocol on the wire, so brokers of either "
        "kind link with each other (docs/benchmarks-cluster.md, Link runtimes)",
        choices=("h2", "grpcio"),
    )
    replicas: int = _key(
        1,
        "copies of each QoS>=1 send-log entry the publisher's PUBACK waits for (this broker and the "
        "next N-1 on the ring of peer ids); 1 = no replication. Above 1 a broker needs "
        "store.persistence and a cluster; persistent sessions are kept on the same N brokers "
        "(docs/cluster.md)",
        min_value=1,
        max_value=7,
    )
    replica_failover_s: int = _key(
        30,
        "with cluster.replicas > 1: a broker reported down this long is gone for good and its replica "
        "holders publish its entries again (at once when it comes back with its data directory lost)",
        min_value=1,
        max_value=30 * 86400,
    )
    drain_on_stop_s: int = _key(
        30,
        "with cluster.replicas > 1: on SIGTERM/SIGINT the broker first drains (as POST /drain: "
        "clients moved away, its sessions and send log handed to the brokers that keep copies) "
        "for at most this long, then stops; 0 = stop at once (docs/operations.md)",
        min_value=0,
        max_value=3600,
    )


@dataclass(frozen=True, slots=True)
class FederationConfig:
    enabled: bool = _key(
        False, "federate this broker's site with other sites over SIONet shared links (docs/federation.md)"
    )
    host: str = _key("127.0.0.1", "address the federation gRPC listener binds")
    port: int = _key(7990, "federation gRPC port (0 = an ephemeral port)", min_value=0, max_value=65535)
    advertise_host: str = _key(
        "", 'host other sites dial to reach this broker; "" = federation.host; host:port is its name'
    )
    place: str = _key("", "event place name (seed 000 §3.7.5); every broker of a federation names the same")
    description: str = _key("", "the event place's description, returned to brokers that link here")
    site: str = _key(
        "",
        "name of this broker's site; the brokers of one cluster that each link into the place set the "
        "same name, so an event published in the site is not delivered there twice",
    )
    mode: str = _key(
        "full_filter",
        "routing mode: full_filter (filters travel: no wasted events) or type_only (topic classes "
        "travel: fewer set-up messages, matched at the destination)",
        choices=("full_filter", "type_only"),
    )
    class_levels: int = _key(
        1, "topic levels that form an event type (topic class) in type_only mode", min_value=1, max_value=16
    )
    ttl: int = _key(
        16,
        "how many sites a filter reaches, counting its own (1 = stays in the site, 2 = the neighbours)",
        min_value=1,
        max_value=255,
    )
    upstream: str = _key("", 'host:port of the broker to request the place\'s one shared link to; "" = root')
    one_way: bool = _key(False, "register no filter upstream: this site only publishes into the place")
    accept_links: bool = _key(True, "accept shared links from other sites (children)")
    probe_hops: int = _key(
        3,
        "n of the n-hop upstream discovery that finds re-link targets after a crash",
        min_value=0,
        max_value=64,
    )
    probe_interval_ms: int = _key(
        10_000, "how often the upstream discovery is repeated", min_value=100, max_value=3_600_000
    )
    retry_ms: int = _key(
        2000, "an unlinked broker requests its link again after this long", min_value=50, max_value=600_000
    )
    link_timeout_ms: int = _key(
        5000, "a link request unanswered this long has failed", min_value=100, max_value=600_000
    )
    custody_grace_ms: int = _key(
        10_000,
        "a QoS>=1 event whose link broke (or published while unlinked) waits this long for the "
        "re-linked paths before it is given up",
        min_value=0,
        max_value=3_600_000,
    )
    retained: str = _key(
        "site",
        "site: retained messages stay in the site where they were published (a retained publish "
        "crosses as a live event); place: every retained write is stored by every broker of the "
        "place, last writer wins (docs/federation.md)",
        choices=("site", "place"),
    )
    link_runtime: str = _key(
        "h2",
        "the gRPC runtime of the shared links: 'h2' (SkipMQ's own on the event loop, as "
        "cluster.link_runtime; the dialer also checks that the answering certificate names the "
        "dialed host:port) or 'grpcio' (grpc.aio); the same protocol on the wire",
        choices=("h2", "grpcio"),
    )
    tls_ca_file: str = _key(
        "",
        "PEM CA of the event place (skipmq certs init): linking brokers must present a certificate it signed",
    )
    tls_cert_file: str = _key(
        "",
        "PEM certificate naming this broker's federation name host:port (skipmq certs issue); "
        "re-read when it changes",
    )
    tls_key_file: str = _key("", "PEM private key of federation.tls_cert_file")
    insecure: bool = _key(
        False,
        "plaintext, unauthenticated federation links (anyone reaching the federation port can link "
        "as any broker); without it a federated broker needs federation.tls_ca_file, tls_cert_file "
        "and tls_key_file",
    )


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    node_id: str = _key("", 'this broker\'s id in the cluster; "" = derived from the hostname by the broker')
    data_dir: str = _key("./data", "directory for the store and other state")
    uvloop: bool = _key(True, "use uvloop as the event loop when it is installed")
    store: StoreConfig = field(default_factory=StoreConfig)
    listeners: ListenersConfig = field(default_factory=ListenersConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    pull: PullConfig = field(default_factory=PullConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    sys: SysConfig = field(default_factory=SysConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)
    # Not a key: notes about ignored SKIPMQ_* environment variables, for the broker to log.
    warnings: tuple[str, ...] = field(default=(), metadata={"internal": True})

    @property
    def store_path(self) -> str:
        """The SQLite file: ``store.path`` or ``<data_dir>/skipmq.db``."""
        return self.store.path or os.path.join(self.data_dir, "skipmq.db")


# --- key table derived from the dataclasses ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeySpec:
    """One configuration key (derived from the dataclass fields above)."""

    name: str  # dotted, e.g. "listeners.tcp.port"
    kind: type  # int, bool or str
    default: Any
    doc: str
    min_value: int | None
    max_value: int | None
    choices: tuple[str, ...] | None

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.upper().replace(".", "_")

    def allowed(self) -> str:
        """Human description of the allowed values."""
        if self.choices:
            return "one of " + ", ".join(repr(choice) for choice in self.choices)
        if self.kind is bool:
            return "a boolean (true/false; in env/CLI also 1/0/yes/no)"
        if self.kind is int:
            low = "" if self.min_value is None else str(self.min_value)
            high = "" if self.max_value is None else str(self.max_value)
            return f"an integer in {low}..{high}"
        return "a string"


def _walk(cls: type, prefix: str) -> Iterator[KeySpec]:
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.metadata.get("internal"):
            continue
        kind = hints[f.name]
        name = prefix + f.name
        if is_dataclass(kind):
            yield from _walk(typing.cast(type, kind), name + ".")
        else:
            yield KeySpec(
                name=name,
                kind=kind,
                default=f.default,
                doc=f.metadata["doc"],
                min_value=f.metadata["min"],
                max_value=f.metadata["max"],
                choices=f.metadata["choices"],
            )


KEYS: dict[str, KeySpec] = {spec.name: spec for spec in _walk(BrokerConfig, "")}
SECTIONS: frozenset[str] = frozenset(
    name.rsplit(".", depth)[0] for name in KEYS for depth in range(1, name.count(".") + 1)
)
