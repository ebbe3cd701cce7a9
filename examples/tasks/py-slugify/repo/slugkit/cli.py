"""`python -m slugkit.cli TITLE...` prints one slug per title."""

import sys

from .slug import slugify


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    for title in args:
        print(slugify(title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
