"""What a node tells its operator: status, events, logs, Prometheus, MQTT and the console."""
