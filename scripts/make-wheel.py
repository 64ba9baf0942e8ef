#!/usr/bin/env python3
"""Writes cellc's wheel from a wheel build (scripts/make-wheel.sh): the
Python package, the example cells, and the two libraries that it loads with
ctypes, stripped. One wheel for every CPython from 3.9 (py3-none: no
extension module); `auditwheel repair` then gives it its manylinux tag.

  make-wheel.py BUILD_DIR OUT_DIR
"""

import base64
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The wheel's BLAS (libcellc_runtime.so finds it in site-packages/scipy_openblas32/lib).
BLAS = "scipy-openblas32>=0.3.27"


def project():
    """pyproject.toml's [project], with its version where that file says to
    read it (the regex on CMakeLists.txt that scikit-build-core takes)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        toml = tomllib.load(f)
    meta = dict(toml["project"])
    rule = toml["tool"]["scikit-build"]["metadata"]["version"]
    with open(os.path.join(ROOT, rule["input"])) as f:
        meta["version"] = re.search(rule["regex"], f.read()).group("value")
    return meta


def files(build):
    """(path in the wheel, path here) of everything the package holds."""
    package = os.path.join(ROOT, "python", "cellc")
    out = [("cellc/" + n, os.path.join(package, n))
           for n in sorted(os.listdir(package)) if n.endswith(".py")]
    cells = os.path.join(ROOT, "examples")
    out += [("cellc/cells/" + n, os.path.join(cells, n))
            for n in sorted(os.listdir(cells)) if n.endswith(".cell")]
    for lib in ("libcellc_compiler.so", "libcellc_runtime.so"):
        out.append(("cellc/" + lib, os.path.join(build, "lib", lib)))
    return out


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main(build, out):
    meta = project()
    v = meta["version"]
    tag = "py3-none-linux_x86_64"
    dist = f"cellc-{v}.dist-info"
    with open(os.path.join(ROOT, meta["readme"])) as f:
        readme = f.read()
    requires = "".join(f"Requires-Dist: {d}\n" for d in [*meta["dependencies"], BLAS])
    metadata = (f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {v}\n"
                f"Summary: {meta['description']}\nRequires-Python: {meta['requires-python']}\n"
                f"{requires}Description-Content-Type: text/markdown\n\n{readme}")
    wheel = ("Wheel-Version: 1.0\nGenerator: cellc scripts/make-wheel.py\n"
             f"Root-Is-Purelib: false\nTag: {tag}\n")
    entry_points = "[console_scripts]\n" + "".join(
        f"{name} = {target}\n" for name, target in meta["scripts"].items())
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"cellc-{v}-{tag}.whl")
    records = []
    with tempfile.TemporaryDirectory() as tmp, \
            zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        for name, source in files(build):
            if name.endswith(".so"):
                stripped = os.path.join(tmp, os.path.basename(name))
                subprocess.run(["strip", "--strip-unneeded", "-o", stripped, source], check=True)
                source = stripped
            with open(source, "rb") as f:
                data = f.read()
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(info, data)
            records.append(record_line(name, data))
        for name, text in (("METADATA", metadata), ("WHEEL", wheel),
                           ("entry_points.txt", entry_points)):
            data = text.encode()
            whl.writestr(f"{dist}/{name}", data)
            records.append(record_line(f"{dist}/{name}", data))
        records.append(f"{dist}/RECORD,,")
        whl.writestr(f"{dist}/RECORD", "\n".join(records) + "\n")
    print(path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
