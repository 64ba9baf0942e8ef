//===- BatchTiled.cpp - A CTA per tile of batch rows -----------------------===//
//
// The batch-tiled strategy: one CTA (on the CPU, one iteration of a loop
// over tiles) runs all T steps for its tile, its threads splitting every
// vector's elements. The step's buffers are in workgroup memory (on the CPU,
// on the stack); the products on tensor cores are computed whole, the rest
// element by element.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/CellToTiledKernels/TiledBuilder.h"

namespace mlir::cell {

namespace {

class BatchTiled : public TileStrategy {
public:
  using TileStrategy::TileStrategy;

  void beginKernel(Block *entry, unsigned, gpu::GPUFuncOp kernel) override {
    this->entry = entry;
    this->kernel = kernel;
  }
  /// A CTA a tile: the grid covers the batch (2^31 - 1 tiles along x), and
  /// a loop over tiles would cost the LSTM's kernels at H = 256 spills.
  std::pair<Value, Value> launchTiles() override {
    return {tb.builder.create<gpu::BlockIdOp>(tb.loc, gpu::Dimension::x), Value()};
  }

  Value rowBuffer(ArrayRef<int64_t> full) override {
    if (tb.gpu) {
      auto memSpace = gpu::AddressSpaceAttr::get(tb.builder.getContext(),
                                                 gpu::AddressSpace::Workgroup);
      return kernel.addWorkgroupAttribution(
          MemRefType::get(full, tb.element, MemRefLayoutAttrInterface(), memSpace),
          tb.loc);
    }
    OpBuilder at = OpBuilder::atBlockBegin(entry);
    return at.create<memref::AllocaOp>(tb.loc, MemRefType::get(full, tb.element));
  }
  void forEachElement(int64_t n, function_ref<void(Value j)> body) override {
    Value begin = tb.tid, end = tb.index(n);
    tb.forRange(begin, end, tb.ntid, body);
  }
  void forEachPartial(int64_t n, function_ref<Value(Value j)> term,
                      function_ref<void(Value slot, Value partial)> sink) override {
    tb.sinkPartial(tb.index(0), tb.sumRange(tb.tid, tb.index(n), tb.ntid, term), sink);
  }
  int64_t partialSlots() const override { return tb.partialsPerCta(); }
  void barrier() override {
    if (tb.gpu)
      tb.builder.create<gpu::BarrierOp>(tb.loc);
  }
  bool computesProduct(Operation *op) override {
    return tb.gpu && onTensorCores(op, tb.precision);
  }
  void emitProduct(Operation *op, Value out) override {
    tb.emitTensorCoreMatvec(op, out);
  }

private:
  Block *entry = nullptr;
  gpu::GPUFuncOp kernel;
};

} // namespace

std::unique_ptr<TileStrategy> makeBatchTiled(TiledBuilder &tb, const TilePlan &plan) {
  return std::make_unique<BatchTiled>(tb, plan);
}

} // namespace mlir::cell
