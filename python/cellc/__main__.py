"""`python3 -m cellc TOOL ARGS...` runs cellc, cellc-opt or cellc-tune."""

import sys

from ._tools import TOOLS, run


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write("usage: python3 -m cellc {%s} [ARGS...]\n" % ",".join(TOOLS))
        return 0 if argv else 2
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
