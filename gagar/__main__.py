import sys

from gagar.cli import main

sys.exit(main())
