"""MQTT 3.1.1 / 5.0 protocol: packets, sans-I/O codec, topic matching, sessions."""
