/* log.c: one line per message: time, level, text. */
#include "config.h"
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static enum log_level level = LOG_INFO;
static const char *const names[] = { "error", "warn", "info", "debug" };

void
log_set_level(enum log_level l)
{
	level = l;
}

int
log_level_from_name(const char *s)
{
	int i;

	for (i = 0; i <= LOG_DEBUG; i++)
		if (strcmp(s, names[i]) == 0)
			return i;
	return -1;
}

void
log_msg(enum log_level l, const char *fmt, ...)
{
	char stamp[32];
	struct timespec ts;
	struct tm tm;
	va_list ap;

	if (l > level)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	localtime_r(&ts.tv_sec, &tm);
	strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
	va_start(ap, fmt);
	flockfile(stderr);
	fprintf(stderr, "%s.%03ld %-5s ", stamp, ts.tv_nsec / 1000000, names[l]);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	funlockfile(stderr);
	va_end(ap);
}
