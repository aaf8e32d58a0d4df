import sys

from tiergate.cli import main

sys.exit(main())
