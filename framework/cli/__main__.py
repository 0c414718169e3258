"""`python -m schedlab.cli` is the `schedlab` command."""

import sys

from schedlab.cli import main

sys.exit(main())
