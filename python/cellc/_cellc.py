"""cellc's compiler and JIT (use the cellc package).

The compiler's C interface (tools/CompilerC.h) in libcellc_compiler.so,
through ctypes: one function that takes a request and gives an answer, both
JSON, so that one wheel serves every CPython. The compiler's errors come
back as CellError (a bad cell, with its file:line:col messages), SizeError
(a cell wrong only at these sizes), TypeError or ValueError.
"""

import ctypes
import enum
import json
import operator
import os
import warnings


class CellError(ValueError):
    """A bad cell: the front end's file:line:col messages."""


class SizeError(CellError):
    """A cell that is wrong only at the sizes it was compiled at."""


def _load():
    # The runtime first: the compiler library links it.
    from ._cellc_runtime import library_path as find
    path = find("libcellc_compiler.so")
    lib = ctypes.CDLL(path)
    lib.cellc_compiler_call.argtypes = [ctypes.c_char_p]
    lib.cellc_compiler_call.restype = ctypes.c_void_p
    lib.cellc_compiler_free_text.argtypes = [ctypes.c_void_p]
    lib.cellc_compiler_free_text.restype = None
    lib.cellc_compiler_version.restype = ctypes.c_char_p
    return lib, path


_LIB, library_path = _load()
__version__ = _LIB.cellc_compiler_version().decode()
_RAISED = {"cell": CellError, "size": SizeError, "type": TypeError, "value": ValueError}


def _call(fn, **args):
    """Runs compiler function `fn` on `args` (CompilerC.cpp's table)."""
    # operator.index: numpy's and torch's integers as sizes, as pybind11 took them.
    request = json.dumps({"fn": fn, "args": args}, default=operator.index)
    pointer = _LIB.cellc_compiler_call(request.encode("utf-8", "surrogateescape"))
    if not pointer:
        raise MemoryError("the compiler's answer did not fit in memory")
    try:
        reply = json.loads(ctypes.string_at(pointer).decode("utf-8", "surrogateescape"))
    finally:
        _LIB.cellc_compiler_free_text(pointer)
    for message in reply["warnings"]:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    if "error" in reply:
        raise _RAISED[reply["error"]](reply["message"])
    return reply["result"]


class _Words(enum.Enum):
    """The words of an enum of the kernel interface (KernelInterface.def),
    named as the words are: Target.cuda, getattr(Strategy, "batch-tiled")."""

    def __new__(cls, index, help_text):
        member = object.__new__(cls)
        member._value_ = index
        member.__doc__ = help_text
        return member


def _words(name, pairs):
    return _Words(name, [(word, (i, text)) for i, (word, text) in enumerate(pairs)],
                  module=__name__)


_ENUMS = _call("words")
Emit = _words("Emit", _ENUMS["Emit"])
Target = _words("Target", _ENUMS["Target"])
Strategy = _words("Strategy", _ENUMS["Strategy"])
Precision = _words("Precision", _ENUMS["Precision"])
Storage = _words("Storage", _ENUMS["Storage"])
AUTO_MIN_CHUNKS = _call("auto_min_chunks")


def output_names(source, file_name):
    """The names of a cell's per-step outputs."""
    return _call("output_names", source=source, file_name=file_name)


def declarations(source, file_name):
    """The declarations of a cell: (kind, name, shape), each size a list of
    (coefficient, [size names]) terms."""
    return [(kind, name, [[(c, names) for c, names in size] for size in shape])
            for kind, name, shape in _call("declarations", source=source,
                                           file_name=file_name)]


def prepare_package(source, file_name, sizes, dtype, threads=0, use_cache=True, batch=0,
                    step=False, unit_slices=None, part=""):
    """Builds the CPU package of the cell at `sizes` (or finds it in the
    cache): (path, from_cache, config_source, temporary, threads,
    unit_slices). With `step`, the kernels of a streaming step (no hoisted
    projections); with `part` ("prologue"), that part of the cell's chunkwise
    form."""
    return tuple(_call("prepare_package", source=source, file_name=file_name,
                       sizes=dict(sizes), dtype=dtype, threads=threads, use_cache=use_cache,
                       batch=batch, step=step, unit_slices=unit_slices, part=part))


def tuned_config(source, sizes, dtype, batch):
    """The tuned config of the cell at these sizes, or None."""
    return _call("tuned_config", source=source, sizes=dict(sizes), dtype=dtype, batch=batch)


def tuning_key(source, sizes, dtype, batch):
    return _call("tuning_key", source=source, sizes=dict(sizes), dtype=dtype, batch=batch)


def emit(source, file_name, sizes, dtype, stage, save_gates=-1):
    """The cell's IR at `stage`, and the warnings: (text, messages)."""
    return tuple(_call("emit", source=source, file_name=file_name, sizes=dict(sizes),
                       dtype=dtype, stage=stage, save_gates=save_gates))


def chunkwise(source, file_name, sizes, dtype):
    """The cell's chunkwise split at `sizes`, as JSON text."""
    return _call("chunkwise", source=source, file_name=file_name, sizes=dict(sizes),
                 dtype=dtype)


def chunk_plan(source, file_name, sizes, dtype, steps, batch, mode, chunk=0):
    """What a training step of the cell's chunk form holds, in bytes: the
    step form's keys but piece_steps, and the parts'."""
    from ._cellc_runtime import plan_dict
    answer = _call("chunk_plan", source=source, file_name=file_name, sizes=dict(sizes),
                   dtype=dtype, steps=steps, batch=batch, mode=mode, chunk=chunk)
    plan = plan_dict(answer.pop("plan"))
    plan.pop("piece_steps")
    plan.update(answer)
    return plan


def default_chunk_length(steps):
    return _call("default_chunk_length", steps=steps)


def chunk_kernels_simt(path, mutation=""):
    """Writes the SIMT emulator's object of the chunk form's CUDA kernels
    (runtime/cuda/ChunkKernels.cu) to `path`, with a planted bug
    (`mutation`, as package()'s simt_mutation)."""
    _call("chunk_kernels_simt", path=os.fspath(path), mutation=mutation)


def cache_dir():
    return _call("cache_dir")


def compiler_version():
    return _call("compiler_version")


_KNOBS = [(name, default, text, tuple(uses)) for name, default, text, uses in _call("knobs")]


def knobs():
    """The knobs of Knobs.def as (name, default, help, uses)."""
    return list(_KNOBS)


_PACKAGE_KNOBS = {name for name, _, _, uses in _KNOBS if "python" in uses}
_WORD_KNOBS = {name for name, default, _, _ in _KNOBS if isinstance(default, str)}


def package(source, file_name, sizes, dir, arch="sm_90", *, simt=False, simt_mutation="",
            part="", **knobs):
    """Writes an AOT CUDA package of the cell at `sizes` into `dir` (of that
    `part` of its chunkwise form), with the knobs that knobs() says python
    takes, by name; a knob given as None or "" is not named."""
    unknown = sorted(set(knobs) - _PACKAGE_KNOBS)
    if unknown:
        raise TypeError(f"package() got an unexpected keyword argument '{unknown[0]}'")
    named = {}
    for name, value in knobs.items():
        text = "" if value is None else str(value) if name in _WORD_KNOBS else str(int(value))
        if text:
            named[name] = text
    _call("package", source=source, file_name=file_name, sizes=dict(sizes),
          dir=os.fspath(dir), arch=arch, knobs=named, simt=bool(simt),
          simt_mutation=simt_mutation, part=part)
