"""``python -m cli``: the ``memprof`` command without the installed console script."""

import sys

from cli.main import main

sys.exit(main())
