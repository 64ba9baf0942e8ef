"""Tuning: cellc-tune run on a cell (cellc.autotune), whose winner the JIT then
reads from the tuning cache for a batch's power-of-two bucket."""

import json
import os
import subprocess
import sys
import tempfile
import threading

from . import _tools

def _bucket(batch):
    bucket = 1
    while bucket < batch:
        bucket *= 2
    return bucket


def _run_tune(cell, sizes, *, batch, seq_len, target, dtype, save_gates, budget, store,
              compile_only, progress):
    """Runs cellc-tune on `cell` in a process of its own (the tuner forks,
    times and runs ptxas; the compiler library in this one only reads the
    tuning cache). Returns its JSON results, with
    "table": what it printed."""
    with tempfile.TemporaryDirectory() as tmp:
        json_out = os.path.join(tmp, "tune.json")
        args = _tools.command("cellc-tune") + [
            "-", "--source-name", cell.file_name, "--batch", str(batch),
            "--seq-len", str(seq_len), "--target", str(target), "--dtype", dtype,
            "--save-gates", str(int(bool(save_gates))), "--budget", f"{float(budget)}s",
            "--json", json_out]
        args += [f"-D{k}={v}" for k, v in sizes.items()]
        if not store:
            args.append("--no-store")
        if compile_only:
            args.append("--compile-only")
        child = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        # The table comes on stdout, progress and errors on stderr: both
        # drained at once, progress echoed as it comes.
        out = []
        reader = threading.Thread(target=lambda: out.append(child.stdout.read()))
        reader.start()
        child.stdin.write(cell.source.encode())
        child.stdin.close()
        err = b""
        for chunk in iter(lambda: child.stderr.read1(4096), b""):
            err += chunk
            if progress:
                sys.stderr.write(chunk.decode(errors="replace"))
                sys.stderr.flush()
        reader.join()
        code = child.wait()
        message = err.decode(errors="replace").strip().splitlines()
        message = "\n".join(l for l in message if not l.startswith("[")) or f"exit {code}"
        message = message.replace("cellc-tune: error: ", "")
        if code == 3:
            raise RuntimeError(message)
        # 4: no candidate ran correctly; the results say why.
        if code not in (0, 4) or not os.path.exists(json_out):
            raise ValueError(message)
        with open(json_out) as f:
            result = json.load(f)
    result["table"] = out[0].decode(errors="replace")
    return result
