/*
 * socket_path.c: the default socket path. residentd, libresident and the
 * CLI all compile this one file, so that the daemon listens where the
 * clients look, also where XDG_RUNTIME_DIR is unset (root shells, ssh,
 * containers, CI).
 */
#include "resident.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int
rs_default_socket(char *buf, size_t size)
{
	const char *env = getenv("RESIDENT_SOCKET"), *run = getenv("XDG_RUNTIME_DIR");
	int n;

	if (env != NULL && env[0] != '\0')
		n = snprintf(buf, size, "%s", env);
	else if (run != NULL && run[0] == '/')
		n = snprintf(buf, size, "%s/resident/socket", run);
	else
		n = snprintf(buf, size, "/tmp/resident-%u/socket", (unsigned)getuid());
	return n < 0 || (size_t)n >= size ? -1 : 0;
}
