//===- ToolMain.cpp - The main of each of cellc's executables -------------===//
//
// Each tool is a C function, cellc_tool_<name>, so that one library can hold
// all three (libcellc.so, whose options must not register at load); this
// main makes one of them an executable. CMake names it in CELLC_TOOL_ENTRY.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_TOOL_ENTRY
#error "CELLC_TOOL_ENTRY names the tool's entry function, as in cellc_tool_cellc"
#endif

extern "C" int CELLC_TOOL_ENTRY(int argc, char **argv);

int main(int argc, char **argv) { return CELLC_TOOL_ENTRY(argc, argv); }
