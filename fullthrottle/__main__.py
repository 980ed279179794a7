import sys

from fullthrottle.cli import main

sys.exit(main())
