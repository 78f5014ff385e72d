"""``python -m torq.gen_config``: the reference tool's documented form of ``torq-gen-config``."""
import sys

from .cli import main

sys.exit(main())
