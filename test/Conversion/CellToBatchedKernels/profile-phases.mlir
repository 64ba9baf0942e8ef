// With profile-phases, each barrier of the batched kernels reads the cycle
// counter on arriving and on leaving, and adds the slice's work since its last
// barrier and its wait to its site's counters, after the group's 16 barrier
// words: [site][slice][work, wait], 64 slices a site.
// RUN: cellc %examples/lstm.cell -D H=12 -D I=4 --emit=mlir \
// RUN:   | cellc-opt --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:       --convert-cell-to-batched-kernels="profile-phases=true" \
// RUN:   | FileCheck %s
// Without it, no counter is read and a group has its 16 words.
// RUN: cellc %examples/lstm.cell -D H=12 -D I=4 --emit=mlir \
// RUN:   | cellc-opt --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:       --convert-cell-to-batched-kernels \
// RUN:   | FileCheck %s --check-prefix=OFF

// The forward's four sites: the packing, the states' copy, the products and
// the element loops of its one phase. 16 + 4 x 64 x 2 = 528 words a group.
// CHECK-LABEL: func.func @lstm_fwd
// CHECK-SAME:    %[[WORDS:[^:]+]]: memref<?xi32>, %[[GROUP:[^:]+]]: index, %[[SLICE:[^:]+]]: index, %{{[^:]+}}: index, %{{[^:]+}}: index, %{{[^:]+}}: index)
// CHECK-SAME:    cell.barrier_words = 528
// CHECK-SAME:    cell.profile_shift = 4
// CHECK-SAME:    cell.profile_sites = ["pack", "states", "phase 1 products", "phase 1 elements"]
// CHECK-SAME:    cell.profile_slices = 64
// The clock starts at the kernel's entry.
// CHECK:         %[[CLOCK:.+]] = memref.alloca() : memref<i64>
// CHECK-NEXT:    %[[START:.+]] = llvm.call_intrinsic "llvm.readcyclecounter"()
// CHECK-NEXT:    memref.store %[[START]], %[[CLOCK]][]
// CHECK:         %[[GROUP_WORDS:.+]] = arith.constant 528 : index
// The packing's barrier: the arrival, the wait among the slices (the count
// word at group x 528), the departure.
// CHECK:         %[[ARRIVED:.+]] = llvm.call_intrinsic "llvm.readcyclecounter"()
// CHECK:         %[[COUNT:.+]] = arith.muli %[[GROUP]], %[[GROUP_WORDS]]
// CHECK:         memref.atomic_rmw addi %{{.+}}, %[[WORDS]][%[[COUNT]]]
// CHECK:         %[[LEFT:.+]] = llvm.call_intrinsic "llvm.readcyclecounter"()
// CHECK-NEXT:    %[[LAST:.+]] = memref.load %[[CLOCK]][]
// CHECK-NEXT:    memref.store %[[LEFT]], %[[CLOCK]][]
// Slices past the 64th are not counted.
// CHECK:         arith.cmpi ult, %[[SLICE]], %c64
// Site 0's words start after the 16 barrier words.
// CHECK:         %[[BASE:.+]] = arith.muli %[[GROUP]], %[[GROUP_WORDS]]
// CHECK-NEXT:    %[[FIRST:.+]] = arith.addi %[[BASE]], %c16 : index
// CHECK:         %[[OWN:.+]] = arith.muli %[[SLICE]], %c2
// CHECK-NEXT:    %[[WORD:.+]] = arith.addi %[[FIRST]], %[[OWN]]
// The work since the last barrier, then the wait, in cycles over 16.
// CHECK:         %[[WORK:.+]] = arith.subi %[[ARRIVED]], %[[LAST]] : i64
// CHECK-NEXT:    %[[WORK16:.+]] = arith.shrui %[[WORK]], %c4_i64
// CHECK:         %[[WORK_AT:.+]] = arith.addi %[[WORD]], %c0
// CHECK-NEXT:    %[[WORK32:.+]] = arith.trunci %[[WORK16]] : i64 to i32
// CHECK-NEXT:    %[[OLD:.+]] = memref.load %[[WORDS]][%[[WORK_AT]]]
// CHECK-NEXT:    %[[SUM:.+]] = arith.addi %[[OLD]], %[[WORK32]] : i32
// CHECK-NEXT:    memref.store %[[SUM]], %[[WORDS]][%[[WORK_AT]]]
// CHECK:         %[[WAIT:.+]] = arith.subi %[[LEFT]], %[[ARRIVED]] : i64
// CHECK:         %[[WAIT_AT:.+]] = arith.addi %[[WORD]], %c1
// CHECK:         memref.store %{{.+}}, %[[WORDS]][%[[WAIT_AT]]]
// The states' site (1) is 128 words further on, and the last site's (3)
// at 16 + 3 x 128.
// CHECK:         arith.addi %{{.+}}, %c144 : index
// CHECK:         arith.addi %{{.+}}, %c272 : index
// CHECK:         arith.addi %{{.+}}, %c400 : index
// CHECK-NOT:     llvm.call_intrinsic
// CHECK:         return

// The backward has two phases: 6 sites, 16 + 6 x 128 words.
// CHECK-LABEL: func.func @lstm_bwd
// CHECK-SAME:    cell.barrier_words = 784
// CHECK-SAME:    cell.profile_sites = ["pack", "states", "phase 1 products", "phase 1 elements", "phase 2 products", "phase 2 elements"]

// OFF-LABEL: func.func @lstm_fwd
// OFF-SAME:    cell.barrier_words = 16
// OFF-NOT:     cell.profile_sites
// OFF-NOT:     llvm.call_intrinsic
// OFF:         %[[GROUP_WORDS:.+]] = arith.constant 16 : index
// OFF-NOT:     llvm.call_intrinsic
// OFF-LABEL: func.func @lstm_bwd
// OFF-NOT:     llvm.call_intrinsic
