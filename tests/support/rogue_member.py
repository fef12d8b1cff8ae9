"""A certified but rogue cluster member for the attack tests of tests/process/cluster/.

X holds a certificate of the cluster's own CA (issued into ``tmp_path`` from the CA that
``tools.launcher`` made in the cluster's data root) for its *own* peer id - a compromised or
misconfigured member - and speaks real mTLS gRPC with the project's transport
(``GrpcTransport``) on an event loop of its own, in a thread. It records what the brokers send it.
Subclasses choose how it starts and what it answers (test_impostor.py: on a crashed broker's
address; test_origin_attacks.py: forging other brokers' traffic).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from broker.adapters.transport import GrpcTransport
from broker.adapters.transport.tls import ClusterTls, TlsFiles, issue_broker_cert
from broker.cluster.origin_proof import Signer, Verifier
from tools.launcher import LocalCluster

HOST = "127.0.0.1"


class RogueMember:
    """X's certificate and keys (``tls``, ``signer``, ``verifier``) for ``own_id``, its event loop
    thread, and the items it received (``items``); ``_start`` makes and starts its transport."""

    def __init__(self, cluster: LocalCluster, tmp_path: Path, own_id: str, *, thread_name: str) -> None:
        certs = Path(cluster.data_root) / "certs"
        cert, key = issue_broker_cert(certs, own_id, out_dir=tmp_path, name="x")
        self.tls = ClusterTls(TlsFiles(str(certs / "ca.pem"), str(cert), str(key)))
        self.signer = Signer.from_pem(cert.read_bytes(), key.read_bytes())
        self.verifier = Verifier((certs / "ca.pem").read_bytes())
        self.received: list[tuple[str, object]] = []
        self._lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name=thread_name)
        self._thread.start()

    def start(self) -> None:
        self.transport: GrpcTransport = self._run(self._start())

    async def _start(self) -> GrpcTransport:
        raise NotImplementedError

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30.0)

    def _on_receive(self, sender: str, item: object) -> None:
        with self._lock:
            self.received.append((sender, item))

    def items(self) -> list[tuple[str, object]]:
        with self._lock:
            return list(self.received)

    def close(self) -> None:
        try:
            self._run(self.transport.stop(drain_timeout_s=1.0))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5.0)
