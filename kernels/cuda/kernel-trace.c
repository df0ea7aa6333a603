/*
 * kernel-trace.so: every kernel a CUDA program runs, with its start and end
 * on the device, written to $KERNEL_TRACE (default kernel-trace.txt) when
 * the program exits: one line a kernel, "start end grid block name" (ns,
 * the device's clock; blocks and threads a block; the mangled name).
 *
 * ncu times each kernel alone, with graphs and programmatic dependent
 * launch off, so it cannot show how a step's kernels overlap: a kernel
 * launched early waits for the one before it, and what it adds to the step
 * is the time from that one's end to its own. CUPTI's activity records
 * give every kernel of a replayed graph its own start and end, with the
 * overlap as it is. tests/bench/step-timeline.py reads the file.
 *
 * The driver loads it as an injection library, so the program needs no
 * change:
 *   make kernels/cuda/kernel-trace.so
 *   KERNEL_TRACE=/tmp/t.txt CUDA_INJECTION64_PATH=$PWD/kernels/cuda/kernel-trace.so \
 *       resident-bench -m MODEL --device cuda -p '' -n 32 -b 1 -r 1
 *   tests/bench/step-timeline.py /tmp/t.txt
 * Tracing slows a step by about a fifth (an H200, qwen3-30b-a3b): compare
 * times within a trace, not with an untraced run.
 */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

#define TRACE_BUFFER (8u << 20)

static FILE *trace_out;

static void CUPTIAPI
trace_buffer(uint8_t **buf, size_t *size, size_t *max_records)
{
	*buf = aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, TRACE_BUFFER);
	*size = *buf != NULL ? TRACE_BUFFER : 0;
	*max_records = 0;
}

static void CUPTIAPI
trace_done(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
	CUpti_Activity *r = NULL;

	(void)ctx, (void)stream, (void)size;
	while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
		const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;

		if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || trace_out == NULL)
			continue;
		fprintf(trace_out, "%llu %llu %u %u %s\n", (unsigned long long)k->start, (unsigned long long)k->end,
		    k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ, k->name);
	}
	free(buf);
}

static void
trace_flush(void)
{
	cuptiActivityFlushAll(1);
	if (trace_out != NULL)
		fclose(trace_out);
	trace_out = NULL;
}

/* Called by the driver as it initializes (CUDA_INJECTION64_PATH); 0 refuses the injection. */
int
InitializeInjection(void)
{
	const char *path = getenv("KERNEL_TRACE");

	if (path == NULL)
		path = "kernel-trace.txt";
	if ((trace_out = fopen(path, "w")) == NULL) {
		perror(path);
		return 0;
	}
	/* the concurrent kind: the plain one makes kernels run one at a time */
	if (cuptiActivityRegisterCallbacks(trace_buffer, trace_done) != CUPTI_SUCCESS ||
	    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
		fprintf(stderr, "kernel-trace: CUPTI refused the kernel activity records\n");
		fclose(trace_out);
		trace_out = NULL;
		return 0;
	}
	atexit(trace_flush);
	return 1;
}
