"""paho-mqtt 2.2 as a QoS 2 publisher across broker restarts, with its reconnect fault held off.

paho resets the state of its unacknowledged messages at every reconnect attempt
(``Client.reconnect`` calls ``_messages_reconnect_reset_out`` before it opens the socket): "PUBREL
sent, waiting for PUBCOMP" becomes "re-send the PUBREL". If that attempt fails (the broker is still
restarting after kill -9), the next one resets again, and "re-send the PUBREL" falls into the
branch of messages never acknowledged: paho sends the PUBLISH again, DUP=0, under a packet id the
broker released at the PUBREL - a new message to any broker, routed a second time (MQTT-4.3.3: the
sender must not send the PUBLISH again once it sent the PUBREL).
tests/process/integration/test_paho_qos2_reconnect_pubrel.py shows it against a scripted server.

:class:`PahoQos2Publisher` keeps "waiting for PUBCOMP" across attempts, so that a test of a
broker's exactly-once counts the broker's duplicates, not this client's.
"""

from __future__ import annotations

import paho.mqtt.client as paho


class PahoQos2Publisher(paho.Client):
    """``paho.Client`` whose reconnect attempts re-send a sent PUBREL, never the PUBLISH."""

    def _messages_reconnect_reset_out(self) -> None:
        with self._out_message_mutex:  # an RLock: held again by the reset below
            for message in self._out_messages.values():
                if message.qos == 2 and message.state == paho.mqtt_ms_resend_pubrel:
                    message.state = paho.mqtt_ms_wait_for_pubcomp  # what the reset expects
            super()._messages_reconnect_reset_out()
