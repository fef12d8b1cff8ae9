"""Tools around SkipMQ, one home each: the launcher of broker processes and local clusters
(``tools.launcher``, behind ``skipmq cluster``, the process tests and the cluster benchmark), the
raw MQTT encoder of tests and benchmarks (``tools.mqtt_raw``), the benchmarks' load client
(``tools.loadclient``) and free ports (``tools.ports``). Tools may import ``broker``; nothing in
``broker`` but its command line (``broker.__main__``) imports tools.
"""
