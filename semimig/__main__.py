"""``python -m semimig`` = the ``semimig`` console script."""
import sys

from semimig.cli import main

sys.exit(main())
