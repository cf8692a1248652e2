import sys

from trainmedic.agent.cli import main

sys.exit(main())
