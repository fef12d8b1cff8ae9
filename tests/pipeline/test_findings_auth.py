"""The pipeline's findings at a broker with a password file and an ACL (docs/security.md "The $SYS
tree"): ``FindingsPublisher`` (the job's MQTT sink, paho; no Spark needed) logs in as the user the
ACL grants ``topic write $SYS/skipmq/analytics/#`` and its retained finding is there for a reader;
the same publisher as another user (``readwrite #``, which never covers ``$`` topics) gets
nothing there. ``skipmq-pipeline --mqtt-username`` with ``SKIPMQ_PIPELINE_MQTT_PASSWORD`` passes
the credentials to it and to the snapshot source."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipeline.cli import parser
from pipeline.sinks import FindingsPublisher
from tests.support.cluster import wait_until
from tests.support.interop_broker import REPO_ROOT, BrokerOptions, BrokerProcess
from tests.support.interop_clients import PahoClient, unique_id

ACL = """\
user pipeline
topic write $SYS/skipmq/analytics/#
topic read $SYS/skipmq/+/classes

user carol
topic readwrite #
topic read $SYS/#
"""


def _passwd(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "broker.auth.passwd", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr


def test_findings_need_the_acl_grant_and_the_pipeline_logs_in(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    _passwd("-c", "-b", "pipeline-pw", str(passwd), "pipeline")
    _passwd("-b", "carol-pw", str(passwd), "carol")
    (tmp_path / "acl").write_text(ACL)
    opts = BrokerOptions(allow_anonymous=False, password_file=str(passwd), acl_file=str(tmp_path / "acl"))
    broker = BrokerProcess(tmp_path / "broker", opts).start()
    reader = None
    publishers: list[FindingsPublisher] = []
    try:
        table = unique_id("table")
        topic = f"$SYS/skipmq/analytics/{table}"
        for user in ("pipeline", "carol"):
            publisher = FindingsPublisher(
                [(broker.host, broker.port)], f"findings-{user}", username=user, password=f"{user}-pw"
            )
            publishers.append(publisher)
            client = publisher.clients[0]
            wait_until(client.is_connected, 30, what=f"{user}'s findings client connected")
            publisher.publish(table, {"batch": 1, "by": user})
            # a QoS 1 marker behind it on the same connection: the finding was handled before its PUBACK
            client.publish(f"marker/{user}", b"", qos=1).wait_for_publish(10)
        reader = PahoClient(broker.host, broker.port, version=5, username="carol", password="carol-pw")
        assert _retained(reader, topic) == {"batch": 1, "by": "pipeline"}  # carol's was refused
        # the snapshot source's subscription (pipeline.sources.mqtt_snapshots) as the same user
        snapshots = PahoClient(
            broker.host, broker.port, version=5, username="pipeline", password="pipeline-pw"
        )
        try:
            assert snapshots.subscribe("$SYS/skipmq/+/classes", 1)[0].value == 1
        finally:
            snapshots.close()
    finally:
        for publisher in publishers:
            publisher.close()
        if reader is not None:
            reader.close()
        broker.close()
    args = parser().parse_args(["--mqtt-username", "pipeline"])
    assert args.mqtt_username == "pipeline"


def _retained(reader: PahoClient, topic: str) -> object:
    """The payload a fresh subscription to ``topic`` gets (a retained message), or None."""
    reader.unsubscribe(topic)
    reader.subscribe(topic, 1)
    try:
        return json.loads(reader.wait_message(5.0).payload)
    except TimeoutError:
        return None
