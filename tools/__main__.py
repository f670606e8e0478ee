import sys

from shmq.tools.entry import main

sys.exit(main())
