/*
 * fault.h: test hooks that make a backend fail on purpose, to test what
 * the daemon does when a GPU fails. Off unless an environment variable
 * names the calls to fail:
 *
 *   RESIDENT_CUDA_FAULT   kinds launch (a kernel, a cuBLAS call, a graph),
 *                         copy (cudaMemcpy*), alloc (cudaMalloc*)
 *   RESIDENT_CPU_FAULT    kinds step (a forward step), copy (a KV block copy)
 *
 * The value is "kind:N[,kind:N...]": the Nth call of that kind (counted
 * from the process's start, from 1) fails, once; "kind:N+" makes every
 * call from the Nth on fail. The failing call does nothing and returns an
 * error whose message says it was injected, as a real failure of that
 * call would (a CUDA runtime error, an out-of-memory).
 */
#ifndef RESIDENT_FAULT_H
#define RESIDENT_FAULT_H

enum fault_backend { FAULT_CUDA, FAULT_CPU, FAULT_BACKENDS };
enum fault_kind { FAULT_LAUNCH, FAULT_COPY, FAULT_ALLOC, FAULT_STEP, FAULT_KINDS };

/*
 * Reads the backend's variable (once per process; later calls return the
 * first answer). 0, or ERR_INVAL with a message for a malformed value: the
 * backend then refuses to load, so that a test never runs without the
 * faults it asked for.
 */
int fault_init(enum fault_backend b, char *err);

/* 1 if this call, of kind k, is to fail. Thread-safe; cheap when off. */
int fault_hit(enum fault_backend b, enum fault_kind k);

/* The message of an injected failure ("fault injected by RESIDENT_CUDA_FAULT"). */
const char *fault_message(enum fault_backend b);

#endif
