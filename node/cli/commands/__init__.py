"""The ``murmur`` subcommands, one module each (``ca init|issue|revoke`` share one): each has an
``add_parser(sub, common)`` that adds its parser, and the ``cmd_*`` function the parser calls.
They import what they need when they run, so that ``--help`` need not load torch."""
