//===- IRGenTest.cpp - Tests of building cell IR --------------------------===//

#include "FrontendTestUtil.h"
#include "compiler/Frontend/IRGen.h"
#include "dialects/Cell/IR/CellOps.h"

#include "mlir/IR/MLIRContext.h"
#include "gtest/gtest.h"

using namespace cellc;
using cellc::testing::Source;

static const char *kGru = R"(cell gru {
  input x: [I]
  state h: [H]
  param W_ih: [3*H, I], W_hh: [3*H, H], b_ih: [3*H], b_hh: [3*H]
  x_r, x_z, x_n = chunk(W_ih @ x + b_ih, 3)
  h_r, h_z, h_n = chunk(W_hh @ h + b_hh, 3)
  r = sigmoid(x_r + h_r)
  z = sigmoid(x_z + h_z)
  n = tanh(x_n + r * h_n)
  h = (1 - z) * n + z * h
})";

TEST(IRGenTest, BuildsTheGruWithBoundSizes) {
  mlir::MLIRContext context;
  Source src(kGru);
  auto module = src.build(context, {{"H", 5}, {"I", 3}}, mlir::Float32Type::get(&context));
  ASSERT_TRUE(module) << src.diagnostics();
  auto defs = llvm::to_vector(module->getOps<mlir::cell::DefOp>());
  ASSERT_EQ(defs.size(), 1u);
  mlir::cell::DefOp def = defs[0];
  EXPECT_EQ(def.getSymName(), "gru");
  ASSERT_EQ(def.getInputs().size(), 1u);
  ASSERT_EQ(def.getStates().size(), 1u);
  auto stateType = llvm::cast<mlir::RankedTensorType>(def.getStates()[0].getType());
  EXPECT_EQ(stateType.getDimSize(0), 5);
  EXPECT_TRUE(stateType.getElementType().isF32());

  unsigned matvecs = 0, chunks = 0, params = 0;
  def.walk([&](mlir::Operation *op) {
    matvecs += llvm::isa<mlir::cell::MatvecOp>(op);
    chunks += llvm::isa<mlir::cell::ChunkOp>(op);
    params += llvm::isa<mlir::cell::ParamOp>(op);
  });
  EXPECT_EQ(matvecs, 2u);
  EXPECT_EQ(chunks, 2u);
  EXPECT_EQ(params, 4u);
  // With no 'output' statement the output is the first state.
  ASSERT_EQ(def.getOutputNames().size(), 1u);
  EXPECT_EQ(llvm::cast<mlir::StringAttr>(def.getOutputNames()[0]).getValue(), "h");
  EXPECT_EQ(def.getYield().getOutputs()[0], def.getYield().getStates()[0]);
  // Locations point into the source.
  auto loc = llvm::dyn_cast<mlir::FileLineColLoc>(def.getYield().getStates()[0]
                                                      .getDefiningOp()
                                                      ->getLoc());
  ASSERT_TRUE(loc);
  EXPECT_EQ(loc.getFilename(), "test.cell");
  EXPECT_EQ(loc.getLine(), 10u);
}

TEST(IRGenTest, BuildsInDoublePrecision) {
  mlir::MLIRContext context;
  Source src(kGru);
  auto module = src.build(context, {{"H", 2}, {"I", 2}}, mlir::Float64Type::get(&context));
  ASSERT_TRUE(module) << src.diagnostics();
  auto def = *module->getOps<mlir::cell::DefOp>().begin();
  EXPECT_TRUE(llvm::cast<mlir::RankedTensorType>(def.getInputs()[0].getType())
                  .getElementType()
                  .isF64());
}

TEST(IRGenTest, LiteralsFoldAndBroadcast) {
  mlir::MLIRContext context;
  Source src("cell t { state h: [H]\n h = h * (2 * 3) + sigmoid(0) }");
  auto module = src.build(context, {{"H", 4}}, mlir::Float32Type::get(&context));
  ASSERT_TRUE(module) << src.diagnostics();
  std::vector<double> constants;
  module->walk([&](mlir::cell::ConstantOp op) {
    constants.push_back(op.getValue().convertToDouble());
  });
  ASSERT_EQ(constants.size(), 2u);
  EXPECT_DOUBLE_EQ(constants[0], 6.0);
  EXPECT_DOUBLE_EQ(constants[1], 0.5);
}

TEST(IRGenTest, UnusedParamIsAWarningNotAnError) {
  mlir::MLIRContext context;
  Source src("cell t { state h: [H]\n param u: [H], v: [H]\n h = u * h }");
  auto module = src.build(context, {{"H", 4}}, mlir::Float32Type::get(&context));
  EXPECT_TRUE(module);
  EXPECT_EQ(src.diag.getNumErrors(), 0u);
  EXPECT_EQ(src.diag.getNumWarnings(), 1u);
  EXPECT_NE(src.diagnostics().find("test.cell:2:16: warning: param 'v' is never used"),
            std::string::npos)
      << src.diagnostics();
}
