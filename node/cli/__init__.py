"""The ``murmur`` command: one module per subcommand, and the local swarm, report and monitor."""
