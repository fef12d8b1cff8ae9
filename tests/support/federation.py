"""Federated broker processes and paho clients for tests/process/federation (docs/federation.md).

``Sites.start(name, upstream, **federation settings)`` runs one ``python -m broker`` with
federation on free ports and waits until it serves GET /federation (and, with an upstream, until
it is linked); ``Site.state()`` is that JSON. ``Client`` is a paho-mqtt client whose received
messages land in a queue.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from broker.adapters.transport.tls import issue_broker_cert
from tests.support.paths import REPO_ROOT
from tools.ports import free_ports
from tools.start_wait import not_ready_error, start_timeout_s

HOST = "127.0.0.1"
WAIT_S = 10.0


@dataclass
class Site:
    name: str
    mqtt: int
    http: int
    fed: int
    log: Path
    process: subprocess.Popen[bytes] | None = None
    command: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.fed}"

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{HOST}:{self.http}/federation", timeout=2) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]

    def metrics(self) -> str:
        """The broker's /metrics text (Prometheus exposition)."""
        with urllib.request.urlopen(f"http://{HOST}:{self.http}/metrics", timeout=2) as response:
            return response.read().decode()  # type: ignore[no-any-return]


@dataclass
class Sites:
    tmp: Path
    sites: dict[str, Site] = field(default_factory=dict)

    def start(
        self,
        name: str,
        upstream: Site | None = None,
        *,
        args: tuple[str, ...] = (),
        ca_dir: Path | None = None,
        wait_linked: bool = True,
        **settings: str,
    ) -> Site:
        """``ca_dir``: mutual TLS with a certificate for this broker's federation name issued by
        the CA there (``skipmq certs``' code); without it, ``federation.insecure``."""
        mqtt, http, fed = free_ports(3)
        site = Site(name, mqtt, http, fed, self.tmp / f"{name}.log")
        command = [
            sys.executable, "-m", "broker", "--port", str(mqtt), "--http-port", str(http),
            "--data-dir", str(self.tmp / name), "--node-id", name, "--no-uvloop",
            "--set", "store.persistence=false", "--set", "sys.interval_s=0",
            "--set", "federation.enabled=true", "--set", "federation.place=plant",
            "--set", f"federation.port={fed}", "--set", "federation.retry_ms=300",
            "--set", "federation.probe_interval_ms=500",
        ]  # fmt: skip
        if ca_dir is None:
            command += ["--set", "federation.insecure=true"]
        else:
            cert, key_file = issue_broker_cert(ca_dir, site.address, out_dir=self.tmp / "certs", name=name)
            command += [
                "--set", f"federation.tls_ca_file={ca_dir / 'ca.pem'}",
                "--set", f"federation.tls_cert_file={cert}", "--set", f"federation.tls_key_file={key_file}",
            ]  # fmt: skip
        command += list(args)
        if upstream is not None:
            command += ["--set", f"federation.upstream={upstream.address}"]
        for key, value in settings.items():
            command += ["--set", f"federation.{key}={value}"]
        site.command = command
        self.sites[name] = site
        self._run(site, upstream if wait_linked else None)
        return site

    def restart(self, site: Site, upstream: Site | None = None) -> None:
        """Start ``site`` again with the same command: same ports, same data directory."""
        assert site.process is not None and site.process.poll() is not None, f"{site.name} still runs"
        self._run(site, upstream)

    def _run(self, site: Site, upstream: Site | None) -> None:
        with site.log.open("ab") as log:
            site.process = subprocess.Popen(site.command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        started, bound_s = time.monotonic(), start_timeout_s()  # grows with the load
        waiting_for = "serving /federation"
        while True:
            if site.process.poll() is not None:
                reason = f"exited with status {site.process.returncode} while {waiting_for}"
                raise RuntimeError(not_ready_error(site.name, time.monotonic() - started, reason, site.log))
            try:
                state = site.state()
                if upstream is None or state["parent"] == upstream.address:
                    return
                waiting_for = f"linking to {upstream.address} (parent: {state['parent']})"
            except OSError:
                pass
            if time.monotonic() - started > bound_s:
                raise TimeoutError(not_ready_error(site.name, bound_s, f"still {waiting_for}", site.log))
            time.sleep(0.05)

    def close(self) -> None:
        for site in self.sites.values():
            if site.process is not None and site.process.poll() is None:
                site.process.send_signal(signal.SIGTERM)
        for site in self.sites.values():
            if site.process is not None:
                try:
                    site.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    site.process.kill()
                    site.process.wait()

    def tails(self) -> str:
        return "\n".join(
            f"--- {s.name}\n" + "".join(s.log.read_text().splitlines(True)[-15:]) for s in self.sites.values()
        )


class Client:
    """A paho-mqtt client; received (topic, payload) pairs land in ``messages``."""

    def __init__(self, site: Site, client_id: str) -> None:
        self.messages: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
        self.client.on_message = lambda _c, _u, msg: self.messages.put((msg.topic, msg.payload))
        self.client.connect(HOST, site.mqtt)
        self.client.loop_start()

    def subscribe(self, topic_filter: str) -> None:
        result, _mid = self.client.subscribe(topic_filter, qos=1)
        assert result == paho.MQTT_ERR_SUCCESS

    def unsubscribe(self, topic_filter: str) -> None:
        self.client.unsubscribe(topic_filter)

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(timeout=WAIT_S)

    def received(self, timeout_s: float = WAIT_S) -> tuple[str, bytes]:
        return self.messages.get(timeout=timeout_s)

    def nothing_within(self, seconds: float) -> bool:
        try:
            self.messages.get(timeout=seconds)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def key(topic_filter: str) -> str:
    return "f:" + topic_filter
