"""`python -m ejkernel`: the `ejkernel` command."""

import sys

from ejkernel.cli import main

sys.exit(main())
