import sys

from node.cli.main import main

sys.exit(main())
