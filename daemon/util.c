/* util.c: error messages, checked allocation, files, UTF-8. */
#include "config.h"
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int
err_set(char *err, int code, const char *fmt, ...)
{
	va_list ap;

	if (err == NULL)
		return code;
	va_start(ap, fmt);
	vsnprintf(err, ERR_LEN, fmt, ap);
	va_end(ap);
	return code;
}

int
errno_no_space(int e)
{
	return e == ENOSPC || e == EFBIG || e == EDQUOT;
}

int
err_prefix(char *err, int code, const char *fmt, ...)
{
	char old[ERR_LEN];
	size_t n;
	va_list ap;

	if (err == NULL)
		return code;
	memcpy(old, err, ERR_LEN);
	old[ERR_LEN - 1] = '\0';
	va_start(ap, fmt);
	vsnprintf(err, ERR_LEN, fmt, ap);
	va_end(ap);
	n = strlen(err);
	if (n + 2 < ERR_LEN) {
		memcpy(err + n, ": ", 3);
		strncat(err + n + 2, old, ERR_LEN - n - 3);
	}
	return code;
}

void
fatal(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("fatal: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	abort();
}

void *
xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (p == NULL)
		fatal("out of memory allocating %zu bytes", n);
	return p;
}

void *
xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);

	if (p == NULL)
		fatal("out of memory allocating %zu x %zu bytes", n, size);
	return p;
}

void *
xrealloc(void *p, size_t n)
{
	void *q = realloc(p, n ? n : 1);

	if (q == NULL)
		fatal("out of memory reallocating %zu bytes", n);
	return q;
}

char *
xstrdup(const char *s)
{
	return xstrndup(s, strlen(s));
}

char *
xstrndup(const char *s, size_t n)
{
	char *p = xmalloc(n + 1);

	memcpy(p, s, n);
	p[n] = '\0';
	return p;
}

void *
xgrow(void *p, uint32_t *cap, uint32_t need, size_t size)
{
	if (need <= *cap)
		return p;
	while (*cap < need)
		*cap = *cap ? *cap * 2 : 16;
	return xrealloc(p, (size_t)*cap * size);
}

uint64_t
hash64(uint64_t h, const void *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
	return h;
}

uint32_t
hash32(const void *p, size_t n)
{
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < n; i++)
		h = (h ^ ((const unsigned char *)p)[i]) * 16777619u;
	return h;
}

void
strbuf_add(struct strbuf *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		b->cap = MAX(b->cap * 2, b->n + n + 64);
		b->s = xrealloc(b->s, b->cap);
	}
	memcpy(b->s + b->n, s, n);
	b->n += n;
	b->s[b->n] = '\0';
}

void
strbuf_cat(struct strbuf *b, const char *s)
{
	strbuf_add(b, s, strlen(s));
}

void
strbuf_printf(struct strbuf *b, const char *fmt, ...)
{
	va_list ap, again;
	int n;

	va_start(ap, fmt);
	va_copy(again, ap);
	n = vsnprintf(NULL, 0, fmt, ap);
	if (n > 0) {
		if (b->n + (size_t)n + 1 > b->cap) {
			b->cap = MAX(b->cap * 2, b->n + (size_t)n + 64);
			b->s = xrealloc(b->s, b->cap);
		}
		vsnprintf(b->s + b->n, (size_t)n + 1, fmt, again);
		b->n += (size_t)n;
	}
	va_end(again);
	va_end(ap);
}

int
mul_size(size_t a, size_t b, size_t *out)
{
	if (a != 0 && b > SIZE_MAX / a)
		return -1;
	*out = a * b;
	return 0;
}

int
read_file(const char *path, char **data, size_t *len, char *err)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t cap = 0, n = 0, got;

	if (f == NULL)
		return err_set(err, ERR_IO, "%s: %s", path, strerror(errno));
	for (;;) {
		if (cap - n < 65536) {
			cap = cap ? cap * 2 : 65536;
			buf = xrealloc(buf, cap + 1);
		}
		got = fread(buf + n, 1, cap - n, f);
		n += got;
		if (got == 0)
			break;
	}
	if (ferror(f)) {
		free(buf);
		fclose(f);
		return err_set(err, ERR_IO, "%s: read error", path);
	}
	fclose(f);
	buf[n] = '\0';
	*data = buf;
	*len = n;
	return 0;
}

int
utf8_seq_len(const unsigned char *s, size_t avail)
{
	unsigned c = s[0];
	int len, i;
	uint32_t cp;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2, cp = c & 0x1f;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3, cp = c & 0x0f;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4, cp = c & 0x07;
	else
		return 0;
	if (avail < (size_t)len)
		return 0;
	for (i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	/* overlong forms, surrogates and beyond U+10FFFF are not UTF-8 */
	if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return 0;
	return len;
}

int
utf8_valid(const char *s, size_t n)
{
	size_t i = 0;
	int l;

	while (i < n) {
		l = utf8_seq_len((const unsigned char *)s + i, n - i);
		if (l == 0)
			return 0;
		i += (size_t)l;
	}
	return 1;
}

uint32_t
utf8_decode(const unsigned char *s, int len)
{
	static const unsigned char lead_mask[5] = { 0, 0x7f, 0x1f, 0x0f, 0x07 };
	uint32_t cp = s[0] & lead_mask[len];

	for (int i = 1; i < len; i++)
		cp = cp << 6 | (s[i] & 0x3f);
	return cp;
}

int
utf8_encode(uint32_t cp, unsigned char out[4])
{
	if (cp < 0x80)
		return out[0] = (unsigned char)cp, 1;
	if (cp < 0x800)
		return out[0] = (unsigned char)(0xc0 | cp >> 6), out[1] = (unsigned char)(0x80 | (cp & 0x3f)), 2;
	if (cp < 0x10000)
		return out[0] = (unsigned char)(0xe0 | cp >> 12), out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3f)),
		       out[2] = (unsigned char)(0x80 | (cp & 0x3f)), 3;
	return out[0] = (unsigned char)(0xf0 | cp >> 18), out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3f)),
	       out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3f)), out[3] = (unsigned char)(0x80 | (cp & 0x3f)), 4;
}

uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int
host_memory(uint64_t *free_b, uint64_t *total, char *err)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	unsigned long long kb;

	*free_b = *total = 0;
	if (f == NULL)
		return err_set(err, ERR_IO, "/proc/meminfo: %s", strerror(errno));
	while (fgets(line, sizeof line, f) != NULL) {
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			*free_b = (uint64_t)kb << 10;
		else if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
			*total = (uint64_t)kb << 10;
	}
	fclose(f);
	return *free_b > 0 ? 0 : err_set(err, ERR_IO, "/proc/meminfo has no MemAvailable");
}
