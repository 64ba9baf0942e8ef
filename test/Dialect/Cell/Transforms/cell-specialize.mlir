// RUN: cellc-opt %s --cell-specialize="save-gates=0" | FileCheck %s --check-prefix=OFF
// RUN: cellc-opt %s --cell-specialize="save-gates=1" | FileCheck %s --check-prefix=ON
// RUN: cellc-opt %s --cell-specialize="save-gates=0" --canonicalize | FileCheck %s --check-prefix=OFF-FOLD
// RUN: cellc-opt %s --cell-specialize | FileCheck %s --check-prefix=ON
// cell-specialize replaces the SAVE_GATES flag with a constant; the branch on
// it then folds. Without the option, gates are saved.

// OFF-LABEL: func.func @store_if_saving
// OFF:         %[[F:.*]] = arith.constant false
// OFF:         scf.if %[[F]]
// OFF-NOT:     cell.save_gates
// ON-LABEL:  func.func @store_if_saving
// ON:          %[[T:.*]] = arith.constant true
// ON:          scf.if %[[T]]
// OFF-FOLD-LABEL: func.func @store_if_saving
// OFF-FOLD-NOT:   memref.store
// OFF-FOLD:       return
func.func @store_if_saving(%buffer: memref<4xf32>, %v: f32) {
  %save = cell.save_gates : i1
  %c0 = arith.constant 0 : index
  scf.if %save {
    memref.store %v, %buffer[%c0] : memref<4xf32>
  }
  return
}
