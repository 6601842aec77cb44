"""``python -m cli``: the `tfopt` command."""

import sys

from cli.main import main

sys.exit(main())
