import sys

from shmq.tools.cli import main

sys.exit(main())
