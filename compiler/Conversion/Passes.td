//===- Passes.td - cellc's conversions --------------------*- tablegen -*-===//

#ifndef CELLC_CONVERSION_PASSES_TD
#define CELLC_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertCellToKernels : Pass<"convert-cell-to-kernels", "::mlir::ModuleOp"> {
  let summary = "Builds the forward and backward sequence kernels of each cell";
  let description = [{
    Replaces each `cell.def @c` and its backward step `@c_grad` with two
    target-independent kernels on `scf`, `arith`, `math`, `memref` and
    `vector`: `@c_fwd` runs the step over `t = 0 .. T-1` and `@c_bwd` runs the
    backward step over `t = T-1 .. 0`, each for the batch rows
    `[b_begin, b_end)`, one row at a time with its states in vector registers.
    A target's strategy hooks in by choosing how it calls them (threads, CTAs)
    and by later rewriting their loops.

    Every kernel argument is a memref of the cell's element type, with the
    time and batch dimensions dynamic, described in order by the kernel's
    `cell.kernel_args` attribute:

    - `@c_fwd(inputs [T,B,n]..., projections [T,B,m]..., resets [T,B] i8,
      initial states [B,n]..., start states [B,n]..., params..., outputs
      [T,B,n]..., state history [T,B,n]..., gates [T,B,S], b_begin, b_end)`.
      The history holds each state after each step; the last step's are the
      final states.
    - `@c_bwd(inputs..., projections..., resets, initial states..., start
      states..., params..., state history..., gates, output gradients
      [T,B,n]..., final-state gradients [B,n]..., then one buffer per result
      of @c_grad: initial-state gradients [B,n], input gradients [T,B,n],
      projection and weight rows [T,B,m], weight vectors [T,B,n], vector-param
      gradients [B,n] summed over time; then start-state gradients [B,n]...,
      b_begin, b_end)`.

    The start state is the state before step 0 of this call; the initial
    state is the value a reset restores. They are the same for a whole
    sequence, and differ when a sequence runs in chunks (the start state is
    then the previous chunk's last state). Where `resets[t, b]` is non-zero,
    the state takes its initial value before step `t`. In backward, the
    gradient of the state before step `t` flows to the initial state at a
    reset, to the start state at `t = 0`, and on to step `t - 1` otherwise. `cell.projection` reads the
    projection buffer at `[t, b]`. `cell.save` becomes stores into `gates`
    under `scf.if` on the `cell.save_gates` flag; `cell.restore` becomes an
    `scf.if` on the same flag that loads the gates or replays the step.
    `cell-specialize` then fixes the flag.

    The recurrent matvec runs `matvec-unroll` weight rows per iteration, each
    row in pieces of `matvec-width` lanes (0: the whole row) accumulated with
    FMAs and reduced once; both must divide the weight's dimensions. Both are knobs
    of cellc-tune, and the pass's options are declared from
    `dialects/Cell/IR/Knobs.def` (KnobOptions.h).

    Expects `cell-split-projections`, `cell-autodiff` and `cell-plan-saves` to
    have run.
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect", "::mlir::func::FuncDialect",
    "::mlir::math::MathDialect", "::mlir::memref::MemRefDialect",
    "::mlir::scf::SCFDialect", "::mlir::vector::VectorDialect",
    "::mlir::cell::CellDialect"
  ];
}

def ConvertCellToTiledKernels
    : Pass<"convert-cell-to-tiled-kernels", "::mlir::ModuleOp"> {
  let summary = "Builds batch-tiled forward and backward kernels for GPUs";
  let description = [{
    Replaces each `cell.def @c` and its backward step `@c_grad` with kernels
    `@c_fwd` and `@c_bwd` that take the same arguments, in the same order and
    with the same `cell.kernel_args`, as `convert-cell-to-kernels`' kernels.
    They are organized for a GPU: one program per tile of `batch-tile` batch
    rows runs all the steps, and its `cta-threads` threads split the elements of
    every vector. Each element is computed as a `vector<BT>` across the rows
    of the tile, so a recurrent weight is loaded once for the tile.

    A value that a thread reads at other elements than its own (the vector of
    a matvec or vecmat, and a value needed by two phases of the step) is
    written to workgroup memory in one phase and read in a later one, with a
    barrier between them. States and state gradients are kept in two
    workgroup slots that alternate between steps. Everything else is computed
    per element in registers. The forward stores the planned gates under the
    `cell.save_gates` flag; the backward loads them or replays them per
    element.

    With `target=cuda` the kernels are `gpu.func`s in `gpu.module
    @cellc_kernels`, one CTA per tile (`b_begin + block_id.x * batch-tile`),
    with workgroup attributions for the buffers. With `target=cpu` they are
    `func.func`s whose tiles run one after another with one thread and no
    barriers: the same element code, for testing on the host. Each kernel
    records `cell.batch_tile`, `cell.threads` and `cell.workgroup_bytes`.

    With `precision=tf32` or `bf16` (CUDA, f32 cells) each recurrent matvec
    and vecmat whose rows are a multiple of 16 and whose depth is a multiple
    of the MMA's k (8 for tf32, 16 for bf16) runs on tensor cores: in the
    first phase where its vector is in workgroup memory, the CTA's warps
    compute the whole `[rows, BT]` product with `mma.sync` (m16n8k8 tf32 or
    m16n8k16 bf16, fp32 accumulators) into a workgroup buffer, and the
    elements read it from there after a barrier. The weights are rounded to
    the precision as they are loaded (tf32: the tensor core ignores the low
    13 mantissa bits; bf16: round to nearest even), and so are the vectors.
    With the persistent strategy a CTA computes its slice of the rows, a
    whole number of 16-row tiles, from its copy of the weights.

    With `strategy=persistent` the CTAs of a tile split every step: CTA `c`
    (block x; the tile is block y) takes the `c`-th slice of each element
    loop and of each matvec's rows. Before the time loop it copies its slice
    of every recurrent weight into workgroup memory (one row padded by one
    element against bank conflicts), and in the loop it computes its rows of
    each product from that copy, its threads splitting rows and depth. The
    buffers that were in workgroup memory (states, materialized values,
    products, accumulators) are in a global workspace argument of
    `cell.workspace_bytes` per tile, and each barrier is grid-wide over the
    tile's CTAs: an arrival count and a generation word per tile in the
    `grid_barrier` argument (zero before the first launch; each launch
    leaves them so), with gpu-scope fences. The CTAs per tile are `ctas`, or
    the fewest whose weight slices and partial products fit in
    `shared-limit` with no more rows than threads; `cell.ctas` records them.
    All CTAs must be resident at once: the runtime launches them
    cooperatively. On the CPU the CTAs run one after another in each phase.

    Each kernel takes the largest tile of at most `batch-tile` rows (4 when
    0) whose workgroup buffers fit in `shared-limit` bytes, so the forward and
    backward tiles may differ. A CUDA kernel that does not fit with one row
    is an error.

    Its knob options, `strategy` (batch-tiled when none is named),
    `precision`, `storage`, `batch-tile`, `ctas`, `shared-limit`,
    `cta-threads` and `max-registers`, are declared from
    `dialects/Cell/IR/Knobs.def` (KnobOptions.h).

    Expects `cell-split-projections`, `cell-autodiff` and `cell-plan-saves` to
    have run.
  }];
  let options = [
    Option<"target", "target", "std::string", "\"cuda\"",
           "cuda (gpu.func kernels) or cpu (func.func kernels, for testing)">,
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect", "::mlir::func::FuncDialect",
    "::mlir::gpu::GPUDialect", "::mlir::math::MathDialect",
    "::mlir::memref::MemRefDialect", "::mlir::scf::SCFDialect",
    "::mlir::vector::VectorDialect", "::mlir::cell::CellDialect",
    "::mlir::LLVM::LLVMDialect", "::mlir::NVVM::NVVMDialect"
  ];
}

def ConvertCellToBatchedKernels
    : Pass<"convert-cell-to-batched-kernels", "::mlir::ModuleOp"> {
  let summary = "Builds CPU kernels whose steps run as phases over a batch tile";
  let description = [{
    Replaces each `cell.def @c` and its backward step `@c_grad` with kernels
    `@c_fwd` and `@c_bwd` that take the same arguments, in the same order and
    with the same `cell.kernel_args`, as `convert-cell-to-kernels`' kernels,
    for the CPU. A kernel runs its batch rows `[b_begin, b_end)` in tiles of
    up to `batch-tile` rows (of one row where the step has no recurrent
    product: the rows of a tile share only the products' weights, and a row
    alone keeps its buffers in cache); each tile runs all the steps, and each
    step is the phases that `PhasePlan` cuts it into:

    - a product phase computes each recurrent product (`cell.matvec`, and in
      backward the transposed `cell.vecmat`) whose vector the previous phase
      wrote, for the whole tile: a `[rows, depth] x [depth, size]` matrix
      product by a register-blocked micro-kernel, `product-rows` rows by
      `product-vectors` vectors of outputs at a time, whose weights were
      packed into panels of that width once per call, before the tiles;
    - an element phase computes, row by row, the values the step writes
      (states, outputs, saved gates, gradients) and those the next phase's
      products read, `vector-width` units at a time with a scalar tail, and
      nothing in between goes through memory.

    The states and the state gradients of the tile alternate between two
    slots of a `[2, tile, n]` buffer; values that two phases read, and every
    product's vector, are written to `[tile, n]` buffers. The forward stores
    the planned gates under the `cell.save_gates` flag; the backward loads
    them or replays the step, its products included (their weights are
    packed only when the gates were not saved).

    With `profile-phases`, each barrier (one ends the packing, the states'
    copy, and each phase's products and elements) reads the cycle counter
    on arriving and on leaving, and adds to its site's counters the cycles
    the slice worked since its last barrier and the cycles it waited. The
    counters follow the group's barrier words (`cell.barrier_words` counts
    both); `cell.profile_sites` names the sites in order.

    Its knob options, `batch-tile` (0: 64), `product-rows`,
    `product-vectors` and `vector-width`, are declared from
    `dialects/Cell/IR/Knobs.def` (KnobOptions.h).

    Expects `cell-split-projections`, `cell-autodiff` and `cell-plan-saves` to
    have run.
  }];
  let options = [
    Option<"vectorBits", "vector-bits", "int64_t", "256",
           "Bits of a vector where vector-width is 0: 256 (8 f32 or 4 f64) or "
           "512 (AVX-512's)">,
    Option<"profilePhases", "profile-phases", "bool", "false",
           "Each barrier adds the cycles its slice worked since the last one "
           "and waited in it to counters after the group's barrier words "
           "(`cell.profile_sites` names them)">,
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect", "::mlir::func::FuncDialect",
    "::mlir::math::MathDialect", "::mlir::memref::MemRefDialect",
    "::mlir::scf::SCFDialect", "::mlir::vector::VectorDialect",
    "::mlir::cell::CellDialect", "::mlir::LLVM::LLVMDialect"
  ];
}

def ConvertKernelsToLLVM : Pass<"convert-kernels-to-llvm", "::mlir::ModuleOp"> {
  let summary = "Lowers the sequence kernels to the LLVM dialect for the CPU";
  let description = [{
    Takes specialized sequence kernels (no `cell.save_gates` left) to the LLVM
    dialect: f32 `tanh`, `exp`, `log` and `log1p` become MLIR's vectorizable
    polynomial approximations (about 1e-7 relative error; f64 keeps libm), and
    then `scf`, `vector`, `math`, `arith`, `memref`, `func` and `cf` go to LLVM
    through the upstream conversions. Every kernel gets a C interface
    (`_mlir_ciface_<name>`, taking memref descriptors) for the runtime.

    Runs after `cell-specialize` and canonicalization.
  }];
  // affine: memref-expand-strided-metadata, for the views of block-diagonal
  // weights, builds affine.apply.
  let dependentDialects = ["::mlir::LLVM::LLVMDialect",
                           "::mlir::cf::ControlFlowDialect",
                           "::mlir::func::FuncDialect",
                           "::mlir::affine::AffineDialect"];
}

def ConvertKernelsToNVVM : Pass<"convert-kernels-to-nvvm", "::mlir::ModuleOp"> {
  let summary = "Lowers the batch-tiled CUDA kernels to the LLVM and NVVM dialects";
  let description = [{
    Takes the `gpu.module` that `convert-cell-to-tiled-kernels{target=cuda}`
    builds, specialized (no `cell.save_gates` left), to `llvm.func` kernels
    with NVVM intrinsics: f32 `tanh`, `exp`, `log` and `log1p` become MLIR's
    polynomial approximations, as on the CPU (about 1e-7 relative error, no
    libdevice); `sqrt`, `abs` and `fma` become LLVM intrinsics that NVPTX
    selects; workgroup buffers go to address space 3, thread and block ids
    and barriers to NVVM. Memref arguments are passed as expanded descriptors
    (allocated and aligned pointer, offset, sizes, strides), indices as i64.

    Runs after `cell-specialize` and canonicalization. `cellc::serializeToPTX`
    then attaches an NVVM target and runs LLVM's NVPTX backend.
  }];
  let dependentDialects = ["::mlir::LLVM::LLVMDialect",
                           "::mlir::NVVM::NVVMDialect",
                           "::mlir::cf::ControlFlowDialect",
                           "::mlir::affine::AffineDialect"];
}

#endif // CELLC_CONVERSION_PASSES_TD
