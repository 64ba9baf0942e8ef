"""A cell's CUDA kernels: its AOT packages in the cache, built for the GPU at
hand (or for the SIMT emulator), and the calls that run them. Part of
cellc.Cell (a mixin)."""

import hashlib
import json
import os
import shutil
import warnings

import torch

from . import _cellc

def _compiler_build():
    """The compiler's version and this build of it (the size and time of the
    library that holds it): a CUDA package that another build wrote, whose
    kernels may differ under the same version, is not reused."""
    st = os.stat(_cellc.library_path)
    return f"{_cellc.compiler_version()}-{st.st_size}-{st.st_mtime_ns}"


#: The target that runs the CUDA kernels in the SIMT emulator, on the CPU.
EMULATED = "cuda-emu"

#: The CUDA knobs that `cuda_package` takes (Knobs.def, through the
#: compiler library): name -> (default, help).
_CUDA_KNOBS = {name: (default, help) for name, default, help, uses in _cellc.knobs()
               if "python" in uses}
_CUDA_OPTIONS = set(_CUDA_KNOBS)


class CudaTargets:
    def cuda_package(self, sizes, *, arch="sm_90", simt=False, part=None, **options):
        """Compiles the cell for CUDA at `sizes` into an AOT package (PTX of both
        SAVE_GATES variants and kernels.json, as `cellc --emit=package` writes)
        in the cache directory, once per cell, sizes, options and compiler
        version, and returns its directory. `options` are the CUDA knobs
        (`_CUDA_KNOBS`: strategy, precision, storage, batch_tile, ctas,
        shared_limit); one not named (or None) keeps its default. With no
        `strategy`, it is chosen as `cellc` chooses it: batch-tiled where a
        CTA's buffers fit in 48 KiB, else persistent. `shared_limit`
        (persistent: the dynamic shared memory of a CTA; 0: 49152 when
        persistent is named, the `arch`'s opt-in when chosen). With `simt`,
        the package holds the kernels for the SIMT emulator too
        (target="cuda-emu"). `part` ("prologue"): the package of that part
        of the cell's chunkwise form (`cellc --chunk-part`)."""
        unknown = set(options) - _CUDA_OPTIONS
        if unknown:
            raise TypeError(f"cuda_package() got an unexpected keyword argument "
                            f"{sorted(unknown)[0]!r}")
        named = {k: v for k, v in options.items() if v is not None and v != ""}
        key = hashlib.sha256(json.dumps(
            [_compiler_build(), self.source, sorted(sizes.items()), arch,
             sorted(named.items()), simt] + ([part] if part else [])
        ).encode()).hexdigest()[:32]
        root = os.path.join(_cellc.cache_dir(), "cuda")
        path = os.path.join(root, key)
        if not os.path.exists(os.path.join(path, "kernels.json")):
            os.makedirs(root, exist_ok=True)
            tmp = f"{path}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                _cellc.package(self.source, self.file_name, sizes, tmp, arch, simt=simt,
                               part=part or "", **named)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            try:
                os.rename(tmp, path)  # atomic; a concurrent writer may have won
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        return path

    def _device_package(self, sizes, arch, storage, shared_optin, sms, simt=False, part=None):
        """The package for a device of `arch` with `sms` SMs whose CTAs may opt
        in to `shared_optin` bytes of shared memory: the cell's CUDA options;
        when they name no strategy, chosen as `cuda_package` chooses it, a
        persistent CTA using the device's opt-in shared memory (a LayerNorm
        LSTM's backward at H = 256 does not fit a batch-tiled CTA). A
        persistent tile takes at most the device's SMs (`max_ctas`, unless
        the options name `ctas` or `max_ctas`), so that its cooperative grid
        launches there; where that many CTAs cannot keep every recurrent
        weight on chip, the rest are read from global memory, and a warning
        says so once."""
        options = dict(self.cuda_options)
        options.pop("storage", None)  # `storage`, which follows it
        if "strategy" not in options:
            options["shared_limit"] = options.get("shared_limit") or shared_optin
        if options.get("strategy") in (None, "persistent") and not options.get("ctas"):
            options["max_ctas"] = options.get("max_ctas") or sms
        path = self.cuda_package(sizes, arch=arch, storage=storage, simt=simt, part=part,
                                 **options)
        self._warn_global_weights(path, sizes, sms)
        return path

    def _warn_global_weights(self, path, sizes, sms):
        """Warns once per package whose persistent kernels read recurrent
        weights from global memory."""
        with open(os.path.join(path, "kernels.json")) as f:
            kernels = json.load(f)["kernels"]
        spilled = {name: k.get("global_weights", 0) for name, k in kernels.items()
                   if k.get("global_weights", 0)}
        warned = self.__dict__.setdefault("_warned_packages", set())
        if not spilled or path in warned:
            return
        warned.add(path)
        which = ", ".join(f"{n} {name}" for name, n in sorted(spilled.items()))
        warnings.warn(
            f"{self.file_name}: at {dict(sorted(sizes.items()))} the persistent strategy's "
            f"CTAs (at most the GPU's {sms} SMs a batch tile, so that the grid is "
            f"resident at once) cannot keep every recurrent weight in shared memory: "
            f"products of {which} read their weights from global memory (L2) at every "
            "step, which is slower. precision='bf16' halves the weights on chip.",
            stacklevel=4)

    def _storage_dtype(self):
        """The torch dtype of the CUDA option `storage`, or None where the
        storage follows the inputs' dtype."""
        storage = self.cuda_options.get("storage")
        if storage is None:
            return None
        return torch.bfloat16 if storage == _cellc.Storage.bf16.name else torch.float32

    def _runs_cuda(self, device):
        """Whether tensors on `device` run the CUDA kernels: on a GPU, or in
        the SIMT emulator (target="cuda-emu")."""
        return device.type == "cuda" or self.emulated

    def _cuda_cell(self, sizes, dtype, device, part=None):
        """The CUDA kernels at `sizes` for `device`, stored as `dtype`
        (bfloat16, else float32): loaded once. Emulated, for an H100 (sm_90,
        and its opt-in shared memory). `part`: those of that part of the
        chunkwise form (cuda_package)."""
        from . import cuda
        storage = (_cellc.Storage.bf16 if dtype == torch.bfloat16
                   else _cellc.Storage.f32).name
        if self.emulated:
            key = (tuple(sorted(sizes.items())), storage, EMULATED, part)
            if key not in self._cuda:
                # The emulator's device model: an H100/H200 (132 SMs), or
                # $CELLC_EMU_SMS of them.
                sms = int(os.environ.get("CELLC_EMU_SMS") or 132)
                path = self._device_package(sizes, "sm_90", storage, 232448, sms, simt=True,
                                            part=part)
                self._cuda[key] = cuda.CudaCell(cuda.Package(path), emulate=True,
                                                shuffle_seed=self.shuffle_seed)
            return self._cuda[key]
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (tuple(sorted(sizes.items())), storage, index, part)
        cell = self._cuda.get(key)
        if cell is None:
            major, minor = torch.cuda.get_device_capability(index)
            props = torch.cuda.get_device_properties(index)
            optin = getattr(props, "shared_memory_per_block_optin", 0) or 49152
            path = self._device_package(sizes, f"sm_{major}{minor}", storage, optin,
                                        props.multi_processor_count, part=part)
            cell = cuda.CudaCell(cuda.Package(path), device=index)
            self._cuda[key] = cell
        return cell
