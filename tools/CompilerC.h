/*===- CompilerC.h - The compiler's C interface -------------------*- C -*-===//
 *
 * What python/cellc/_cellc.py calls through ctypes: the front end, the
 * pipelines and the JIT behind one function that takes a request and gives
 * an answer, both JSON text. Compiling takes milliseconds at least, so that
 * the text costs nothing that shows, and one function keeps the library's
 * C surface to three names however many calls Python makes (issue 61: one
 * wheel for every CPython, no extension module).
 *
 *===----------------------------------------------------------------------===*/

#ifndef CELLC_TOOLS_COMPILERC_H
#define CELLC_TOOLS_COMPILERC_H

#ifdef __cplusplus
extern "C" {
#endif

/* Runs `request`, {"fn": name, "args": {...}}, and returns (free it with
 * cellc_compiler_free_text) {"result": value, "warnings": [...]} or
 * {"error": kind, "message": text, "warnings": [...]}, the kind one of
 * "cell" (a bad cell: file:line:col messages), "size" (a cell wrong only at
 * these sizes), "type" and "value". The functions are listed in
 * CompilerC.cpp's table. */
char *cellc_compiler_call(const char *request);
void cellc_compiler_free_text(char *text);
const char *cellc_compiler_version(void);

#ifdef __cplusplus
}
#endif

#endif /* CELLC_TOOLS_COMPILERC_H */
