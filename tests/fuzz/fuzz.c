/* fuzz.c: inputs as files for the fuzz targets of file loaders (fuzz.h). */
#include "fuzz.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes all n bytes to fd; aborts on failure. */
static void
write_all(int fd, const uint8_t *data, size_t n)
{
	ssize_t w;

	while (n > 0) {
		if ((w = write(fd, data, n)) <= 0)
			abort();
		data += w;
		n -= (size_t)w;
	}
}

int
fuzz_memfile(const uint8_t *data, size_t n, char path[FUZZ_PATH_LEN])
{
	int fd = memfd_create("fuzz", MFD_CLOEXEC);

	if (fd < 0)
		abort();
	write_all(fd, data, n);
	snprintf(path, FUZZ_PATH_LEN, "/proc/self/fd/%d", fd);
	return fd;
}

void
fuzz_write(const char *dir, const char *name, const uint8_t *data, size_t n)
{
	char path[4096];
	int fd;

	snprintf(path, sizeof path, "%s/%s", dir, name);
	if ((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0)
		abort();
	write_all(fd, data, n);
	close(fd);
}
