"""Counts the global stores of one entry function of a PTX file."""

import re
import sys


def entry_body(ptx, name):
    match = re.search(r"\.entry\s+" + re.escape(name) + r"\b", ptx)
    if not match:
        sys.exit(f"no .entry {name}")
    start = ptx.index("{", match.end())
    depth, i = 0, start
    while True:
        if ptx[i] == "{":
            depth += 1
        elif ptx[i] == "}":
            depth -= 1
            if depth == 0:
                return ptx[start:i]
        i += 1


ptx_path, name = sys.argv[1], sys.argv[2]
body = entry_body(open(ptx_path).read(), name)
stores = re.findall(r"^\s*st\.global", body, re.M)
print(f"{name}: {len(stores)} global stores")
