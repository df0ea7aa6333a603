/*
 * fuzz.h: what the fuzz targets share. The loaders of files
 * take paths, so a target hands them its input as a file: an in-memory
 * one (memfd), reached through /proc/self/fd, which mmap and fopen accept
 * like any file and which costs no disk.
 */
#ifndef RESIDENT_FUZZ_H
#define RESIDENT_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#define FUZZ_PATH_LEN 64

/*
 * Writes n bytes into a new in-memory file and its path into path. Returns
 * the descriptor (close it when done); aborts if the system refuses, since
 * a target that cannot make files tests nothing.
 */
int fuzz_memfile(const uint8_t *data, size_t n, char path[FUZZ_PATH_LEN]);

/* Writes n bytes to dir/name, replacing it; aborts on failure. */
void fuzz_write(const char *dir, const char *name, const uint8_t *data, size_t n);

/* Aborts unless c holds: the fuzzer reports an abort as a finding. */
#define FUZZ_CHECK(c) do { if (!(c)) abort(); } while (0)

#endif
