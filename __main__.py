import sys

from shmcache.cli import main

sys.exit(main())
