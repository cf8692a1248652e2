"""`python -m trainmedic.agent.cli`: the command line, as the `trainmedic` script runs it."""

import sys

from trainmedic.agent.cli import main

if __name__ == "__main__":
    sys.exit(main())
