/* util.h: error reporting and checked allocation shared by every subsystem. */
#ifndef RESIDENT_UTIL_H
#define RESIDENT_UTIL_H

#include <stddef.h>
#include <stdint.h>

/*
 * Error convention: a function that can fail returns 0 or a negative ERR_*
 * code, and writes a message for the user into `err`, a buffer of ERR_LEN
 * bytes owned by the caller (NULL is allowed where the caller does not care).
 */
#define ERR_LEN 256

enum err_code {
	ERR_OK = 0,
	ERR_INVAL = -1,       /* a wrong argument or parameter */
	ERR_NOMEM = -2,       /* an allocation failed */
	ERR_IO = -3,          /* open/read/write/mmap failed */
	ERR_FORMAT = -4,      /* a file or frame is malformed */
	ERR_UNSUPPORTED = -5, /* well-formed but not something we handle */
	ERR_NOTFOUND = -6,    /* a key, tensor, session or model is missing */
	ERR_RANGE = -7,       /* a value beyond a limit */
	ERR_DEVICE = -8,      /* the GPU or another backend failed */
	ERR_QUOTA = -9,       /* a per-user quota is full (sessions per uid) */
	ERR_NOSPACE = -10,    /* a write found no room: disk full, disk quota, file size limit */
	ERR_BUSY = -11,       /* a session has another turn generating, or gained one meanwhile */
};

/* Formats the message into err (if not NULL) and returns code. */
int err_set(char *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Whether errno e says a write found no room: a full disk, a disk quota, a file size limit. */
int errno_no_space(int e);

/* Prepends "prefix: " to the message already in err. Returns code. */
int err_prefix(char *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* For broken invariants and out-of-memory only: prints and aborts. */
void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);

/* p grown by doubling (from 16) to hold need elements of size bytes; *cap updated. */
void *xgrow(void *p, uint32_t *cap, uint32_t need, size_t size);

/* FNV-1a of n bytes: a small table's hash (keys of rules, names, texts). */
uint32_t hash32(const void *p, size_t n);
/* FNV-1a, 64 bits, of n more bytes after h (HASH64_START before the first). */
#define HASH64_START 0xcbf29ce484222325ull
uint64_t hash64(uint64_t h, const void *p, size_t n);

/* A growing NUL-terminated string; zeroed, it is empty (s NULL until it first grows). */
struct strbuf {
	char *s;
	size_t n, cap;
};

/* Appends n bytes. */
void strbuf_add(struct strbuf *b, const char *s, size_t n);
/* Appends a NUL-terminated string. */
void strbuf_cat(struct strbuf *b, const char *s);
void strbuf_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* a*b without overflow; returns -1 when it would exceed SIZE_MAX. */
int mul_size(size_t a, size_t b, size_t *out);

/* Reads a whole file into a NUL-terminated malloc'd buffer. */
int read_file(const char *path, char **data, size_t *len, char *err);

/* Length of the valid UTF-8 sequence starting at s (1..4), or 0 if invalid or truncated. */
int utf8_seq_len(const unsigned char *s, size_t avail);
/* 1 if the n bytes are entirely valid UTF-8. */
int utf8_valid(const char *s, size_t n);
/* The code point of the valid len-byte UTF-8 sequence at s (len from utf8_seq_len). */
uint32_t utf8_decode(const unsigned char *s, int len);
/* UTF-8 of code point cp (not a surrogate, at most U+10FFFF) into out; returns its length (1..4). */
int utf8_encode(uint32_t cp, unsigned char out[4]);

/* Monotonic time in nanoseconds. */
uint64_t now_ns(void);

/* The host's memory: MemAvailable and MemTotal of /proc/meminfo. 0 or ERR_IO. */
int host_memory(uint64_t *free_b, uint64_t *total, char *err);

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
