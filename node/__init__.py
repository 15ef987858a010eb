"""The murmur node daemon: CLI, config, trainer, transport, and the wiring between them."""
