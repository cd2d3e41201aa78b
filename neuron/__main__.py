import sys

from .cli.main import console_main

sys.exit(console_main())
