/*
 * kvdisk.c: session KV files and the thread that reads and writes them.
 *
 * File layout (native byte order; the files never leave the machine):
 *
 *   header   "RSKVSES2", u32 header bytes, u32 0, u64 block bytes,
 *            u64 identity, u64 checksum of the header with this field 0,
 *            the identity text (NUL-terminated, zero-padded to 64 bytes)
 *   record i "RKVB", u32 i, i32 tokens[16], u64 key, K/V (block bytes),
 *            u64 checksum (XXH3) of everything before it in the record
 *
 * A record's key is the prefix cache's chain (kv.h) over the session's
 * blocks up to it, from kv_root(identity, 0): its K/V depend on every token
 * before them, not only on its own 16, so a record written for a history
 * that departed earlier (a turn never committed, a history rendered again)
 * is not read as the one being loaded, wherever the load starts.
 *
 * The directory's first owner holds a lock on DIR/lock (flock) while it
 * runs and writes its pid there: the budget is enforced over one index, so
 * a second daemon on the directory stores nothing (it still removes a
 * deleted session's files, which needs no index).
 *
 * A write first truncates the file after the records it keeps (so that
 * stale bytes never follow new ones), then appends. Nothing is fsync'd: a
 * record that did not reach the disk whole fails its checksum or is
 * missing, and is computed again.
 *
 * RESIDENT_KV_WRITE_STALL=N (tests only): the thread stops for an hour
 * after writing N records of a job, so that a test can kill the daemon in
 * the middle of a write. RESIDENT_KV_MOVE_STALL=N (tests only, read by
 * the engine, carried by the job): a load copies the first block of its
 * first piece up alone and stops for N ms before the rest, so that a test
 * can kill the daemon in the middle of the copy up.
 */
#include "config.h"
#include "kvdisk.h"
#include "kv.h"
#include "worker.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define FILE_MAGIC "RSKVSES2"
#define REC_MAGIC 0x42564b52u /* "RKVB" */
#define HEAD_FIXED 40
/* Records copied between the pool and the file at a time. */
#define CHUNK 8
/*
 * A load's readers, and the records each reads in one go (8 MiB for
 * llama3-8b) and copies up in one kv_move: one thread copying out of the
 * page cache and checksumming reaches 6 GB/s, one stream of reads from an
 * NVMe disk 2.
 */
#define LOAD_READERS 8
#define LOAD_RECORDS 4
/*
 * The tier is a cache: it never takes the last 64 MiB of its filesystem,
 * which the database needs more (a turn that cannot be committed is lost,
 * a record not written is only computed again).
 */
#define FLOOR_BYTES ((uint64_t)64 << 20)

/* A file of the tier, for the budget. */
struct kvfile {
	char rel[128];              /* IDENTITY/UUID.kv */
	uint64_t bytes;
	uint64_t used;              /* order of last use */
};

struct kvdisk {
	char *dir;
	uint64_t budget;              /* 0: the tier stores nothing, it only removes */
	int lock_fd;                  /* DIR/lock, held (flock) while the tier stores; -1 if not */
	struct worker wk;             /* runs the jobs (worker.h) */
	pthread_mutex_t mu;           /* the index, for kvdisk_records and kvdisk_usage */
	/* the files (changed by the worker thread only) */
	struct kvfile *files;
	int n_files, cap_files;
	uint64_t bytes, clock;
	long stall_after;
	/*
	 * Where loads read LOAD_RECORDS records at a time (the worker's): the
	 * backend's host memory (pinned on CUDA, so that the blocks go up
	 * without being copied again), kept from one load to the next since
	 * pinning costs the driver far more than the copy.
	 */
	uint8_t *stage;
	size_t stage_bytes;
	void (*stage_free)(void *);
};

struct rec_head {
	uint32_t magic;
	uint32_t index;
	int32_t tokens[KV_BLOCK_TOKENS];
	uint64_t key;               /* the chain up to this block (above) */
};

/* ---- the file index and the budget ---- */

/* A new index entry for rel. */
static struct kvfile *
file_add(struct kvdisk *d, const char *rel)
{
	if (d->n_files == d->cap_files) {
		d->cap_files = MAX(16, d->cap_files * 2);
		d->files = xrealloc(d->files, (size_t)d->cap_files * sizeof *d->files);
	}
	memset(&d->files[d->n_files], 0, sizeof d->files[0]);
	snprintf(d->files[d->n_files].rel, sizeof d->files[0].rel, "%s", rel);
	return &d->files[d->n_files++];
}

/* The index entry of rel, added if missing. */
static struct kvfile *
file_entry(struct kvdisk *d, const char *rel)
{
	for (int i = 0; i < d->n_files; i++)
		if (strcmp(d->files[i].rel, rel) == 0)
			return &d->files[i];
	return file_add(d, rel);
}

/*
 * Records a file's size and use (bytes 0: the file is gone). The thread
 * changes the index under mu only; kvdisk_records reads it from others.
 */
static void
file_note(struct kvdisk *d, const char *rel, uint64_t bytes, int used)
{
	struct kvfile *f;

	pthread_mutex_lock(&d->mu);
	f = file_entry(d, rel);
	d->bytes = d->bytes - f->bytes + bytes;
	f->bytes = bytes;
	if (used)
		f->used = ++d->clock;
	if (bytes == 0)
		*f = d->files[--d->n_files];
	pthread_mutex_unlock(&d->mu);
}

/* Removes a file of the tier. */
static void
file_remove(struct kvdisk *d, const char *rel)
{
	char path[4096];

	snprintf(path, sizeof path, "%s/%s", d->dir, rel);
	unlink(path);
	file_note(d, rel, 0, 0);
}

/* Removes the least recently used files while the tier is over its budget. */
static void
enforce_budget(struct kvdisk *d)
{
	int i, lru;

	while (d->bytes > d->budget && d->n_files > 0) {
		for (lru = 0, i = 1; i < d->n_files; i++)
			if (d->files[i].used < d->files[lru].used)
				lru = i;
		file_remove(d, d->files[lru].rel);
	}
}

/* 1 if name is the tier's: an identity directory (16 hex digits) or, with kv, a session's file (NAME.kv). */
static int
tier_name(const char *name, int kv)
{
	size_t n = strlen(name);

	if (kv)
		return n > 3 && name[0] != '.' && strcmp(name + n - 3, ".kv") == 0;
	return n == 16 && strspn(name, "0123456789abcdef") == 16;
}

static int
cmp_used(const void *a, const void *b)
{
	const struct kvfile *x = a, *y = b;

	return (x->used > y->used) - (x->used < y->used);
}

/*
 * 0 if the file at path is of another format than this one (an older
 * version's, whose records this one cannot check) or its header is torn.
 */
static int
current_format(const char *path)
{
	char magic[8];
	int fd = open(path, O_RDONLY | O_CLOEXEC), ok;

	if (fd < 0)
		return 1;  /* left to the load, which refuses what it cannot read */
	ok = read(fd, magic, sizeof magic) == (ssize_t)sizeof magic && memcmp(magic, FILE_MAGIC, 8) == 0;
	close(fd);
	return ok;
}

/*
 * Indexes the tier's files already there, oldest modification first, and
 * nothing else: the budget removes what is indexed, and the directory may
 * hold other files. Files of another format go, and identity directories
 * left empty.
 */
static void
scan(struct kvdisk *d, char *note)
{
	DIR *top = opendir(d->dir), *sub;
	struct dirent *a, *b;
	struct kvfile *f;
	struct stat st;
	char path[4096], rel[512];
	int stale = 0;

	while (top != NULL && (a = readdir(top)) != NULL) {
		snprintf(path, sizeof path, "%s/%s", d->dir, a->d_name);
		if (!tier_name(a->d_name, 0) || (sub = opendir(path)) == NULL)
			continue;
		while ((b = readdir(sub)) != NULL) {
			snprintf(rel, sizeof rel, "%s/%s", a->d_name, b->d_name);
			snprintf(path, sizeof path, "%s/%s", d->dir, rel);
			if (!tier_name(b->d_name, 1) || strlen(rel) >= sizeof d->files[0].rel || stat(path, &st) != 0 ||
			    !S_ISREG(st.st_mode))
				continue;
			if (!current_format(path)) {
				stale += unlink(path) == 0;
				continue;
			}
			f = file_add(d, rel);
			f->bytes = (uint64_t)st.st_size;
			f->used = (uint64_t)st.st_mtim.tv_sec;
			d->bytes += f->bytes;
		}
		closedir(sub);
		snprintf(path, sizeof path, "%s/%s", d->dir, a->d_name);
		rmdir(path);  /* only if empty */
	}
	if (top != NULL)
		closedir(top);
	if (stale > 0)
		snprintf(note, ERR_LEN, "KV disk tier: removed %d files of another format than %s (or with a torn "
		    "header) from %.120s", stale, FILE_MAGIC, d->dir);
	/* the uses in mtime order, before this run's */
	if (d->n_files > 1)  /* files is NULL while the index is empty */
		qsort(d->files, (size_t)d->n_files, sizeof *d->files, cmp_used);
	for (int i = 0; i < d->n_files; i++)
		d->files[i].used = ++d->clock;
}

/* ---- the file format ---- */

/* Bytes of the header for an identity text, and of one record. */
static size_t
head_bytes(const char *identity_text)
{
	return HEAD_FIXED + (strlen(identity_text) + 1 + 63) / 64 * 64;
}

static size_t
rec_bytes(size_t block_bytes)
{
	return sizeof(struct rec_head) + block_bytes + sizeof(uint64_t);
}

/* The header for a job's identity; returns its size. */
static size_t
header_make(const struct kvdisk_job *j, uint8_t **out)
{
	size_t text = strlen(j->identity_text) + 1, n = head_bytes(j->identity_text);
	uint8_t *h = xcalloc(1, n);
	uint32_t hb = (uint32_t)n;
	uint64_t bb = j->block_bytes, sum;

	memcpy(h, FILE_MAGIC, 8);
	memcpy(h + 8, &hb, 4);
	memcpy(h + 16, &bb, 8);
	memcpy(h + 24, &j->identity, 8);
	memcpy(h + HEAD_FIXED, j->identity_text, text);
	sum = XXH3_64bits(h, n);
	memcpy(h + 32, &sum, 8);
	*out = h;
	return n;
}

/* 1 if the file starts with the header h (n bytes). */
static int
header_matches(int fd, const uint8_t *h, size_t n)
{
	uint8_t *got = xmalloc(n);
	int ok = pread(fd, got, n, 0) == (ssize_t)n && memcmp(got, h, n) == 0;

	free(got);
	return ok;
}

/* The job's tokens of record i. */
static const int32_t *
job_tokens(const struct kvdisk_job *j, int32_t i)
{
	return j->tokens + (size_t)(i - j->first) * KV_BLOCK_TOKENS;
}

/* Checks record i (rec holds its bytes) against the job's tokens for it and the chain's key up to it. */
static int
rec_valid(const struct kvdisk_job *j, int32_t i, uint64_t key, const uint8_t *rec)
{
	struct rec_head h;
	uint64_t sum;
	size_t body = sizeof h + j->block_bytes;

	memcpy(&h, rec, sizeof h);
	memcpy(&sum, rec + body, sizeof sum);
	return h.magic == REC_MAGIC && h.index == (uint32_t)i && h.key == key &&
	    memcmp(h.tokens, job_tokens(j, i), sizeof h.tokens) == 0 && XXH3_64bits(rec, body) == sum;
}

/* The name of a session's file relative to the tier. */
static void
rel_name(char *rel, size_t len, uint64_t identity, const char *name)
{
	snprintf(rel, len, "%016llx/%s.kv", (unsigned long long)identity, name);
}

/* The path of a job's file, and its name relative to the tier. */
static void
job_paths(const struct kvdisk *d, const struct kvdisk_job *j, char *rel, size_t rel_len, char *path,
    size_t path_len)
{
	rel_name(rel, rel_len, j->identity, j->name);
	snprintf(path, path_len, "%s/%s", d->dir, rel);
}

/* ---- jobs ---- */

/* Writes n bytes at off, all of them; else the ERR_* code (a short write on a regular file is a full disk). */
static int
write_at(int fd, const void *p, size_t n, off_t off, const char *path, char *err)
{
	ssize_t w = pwrite(fd, p, n, off);
	int e = w < 0 ? errno : ENOSPC;

	if (w == (ssize_t)n)
		return 0;
	return err_set(err, errno_no_space(e) ? ERR_NOSPACE : ERR_IO, "%s: %s", path, strerror(e));
}

/*
 * Opens (creating it and its directory) the file of a write, with its
 * header right: a file that is not there (the budget may have removed it)
 * or is another identity's starts again empty, and the write finds its
 * first records missing.
 */
static int
write_open(struct kvdisk *d, struct kvdisk_job *j, const char *rel, const char *path, size_t *head, char *err)
{
	char dir[4096];
	uint8_t *h;
	int fd, rc = 0;

	snprintf(dir, sizeof dir, "%s/%016llx", d->dir, (unsigned long long)j->identity);
	if (mkdir(dir, 0700) != 0 && errno != EEXIST)
		return err_set(err, ERR_IO, "%s: %s", dir, strerror(errno));
	if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0)
		return err_set(err, ERR_IO, "%s: %s", path, strerror(errno));
	*head = header_make(j, &h);
	if (!header_matches(fd, h, *head))
		rc = ftruncate(fd, 0) != 0 ? err_set(err, ERR_IO, "%s: %s", path, strerror(errno)) :
		    write_at(fd, h, *head, 0, path, err);
	free(h);
	if (rc != 0) {
		close(fd);
		unlink(path);
		file_note(d, rel, 0, 0);
		return rc;
	}
	return fd;
}

/* The records the file is long enough to hold, at most upto (the load checks them). */
static int32_t
records_present(int fd, size_t head, size_t rec, int32_t upto)
{
	struct stat st;
	int64_t n;

	if (fstat(fd, &st) != 0 || (size_t)st.st_size < head)
		return 0;
	n = ((int64_t)st.st_size - (int64_t)head) / (int64_t)rec;
	return (int32_t)MIN(n, upto);
}

/* 0 if writing bytes more leaves the filesystem FLOOR_BYTES free; ERR_NOSPACE if not. */
static int
room_for(const struct kvdisk *d, uint64_t bytes, char *err)
{
	struct statvfs sv;
	uint64_t avail;

	if (statvfs(d->dir, &sv) != 0)
		return err_set(err, ERR_IO, "%s: %s", d->dir, strerror(errno));
	avail = (uint64_t)sv.f_bavail * sv.f_frsize;
	if (avail < bytes + FLOOR_BYTES)
		return err_set(err, ERR_NOSPACE, "%s: %llu MiB free; KV files are not written into the last %llu MiB",
		    d->dir, (unsigned long long)(avail >> 20), (unsigned long long)(FLOOR_BYTES >> 20));
	return 0;
}

/*
 * Writes records [first, first + n) after first records; j->done = the
 * file's records after. A failed write leaves no partial record behind.
 */
static int
run_write(struct kvdisk *d, struct kvdisk_job *j, char *err)
{
	char rel[128], path[4096];
	size_t head = 0, rec = rec_bytes(j->block_bytes);
	uint8_t *buf = xmalloc(CHUNK * rec);
	void *dst[CHUNK];
	uint64_t key = j->prev;
	int32_t i, k, c, have;
	int fd, rc = 0;

	job_paths(d, j, rel, sizeof rel, path, sizeof path);
	j->done = 0;
	if ((rc = room_for(d, (uint64_t)MIN(CHUNK, j->n) * rec, err)) != 0 ||
	    (fd = write_open(d, j, rel, path, &head, err)) < 0) {
		free(buf);
		return rc != 0 ? rc : fd;
	}
	if ((have = records_present(fd, head, rec, j->first)) < j->first) {
		/* records before ours went missing: keep what is there, the owner writes them next */
		if (ftruncate(fd, (off_t)(head + (size_t)have * rec)) != 0)
			rc = err_set(err, ERR_IO, "%s: %s", path, strerror(errno));
		j->done = have;
		goto out;
	}
	if (ftruncate(fd, (off_t)(head + (size_t)j->first * rec)) != 0) {
		rc = err_set(err, ERR_IO, "%s: %s", path, strerror(errno));
		goto out;
	}
	j->done = j->first;
	for (i = 0; i < j->n && rc == 0; i += c) {
		c = MIN(CHUNK, j->n - i);
		if (i > 0 && (rc = room_for(d, (uint64_t)c * rec, err)) != 0)
			break;
		for (k = 0; k < c; k++) /* each block straight into its record */
			dst[k] = buf + (size_t)k * rec + sizeof(struct rec_head);
		pthread_mutex_lock(j->copy_mu);
		rc = j->ops->kv_move(j->be, j->blocks + i, c, dst, NULL, err);
		pthread_mutex_unlock(j->copy_mu);
		if (rc != 0)
			break;
		for (k = 0; k < c; k++) {
			struct rec_head h = { REC_MAGIC, (uint32_t)(j->first + i + k), { 0 }, 0 };
			uint8_t *r = buf + (size_t)k * rec;
			uint64_t sum;

			memcpy(h.tokens, job_tokens(j, j->first + i + k), sizeof h.tokens);
			h.key = key = kv_chain(key, h.tokens);
			memcpy(r, &h, sizeof h);
			sum = XXH3_64bits(r, sizeof h + j->block_bytes);
			memcpy(r + sizeof h + j->block_bytes, &sum, sizeof sum);
		}
		for (k = 0; k < c && rc == 0; k++) {
			off_t off = (off_t)(head + (size_t)j->done * rec);

			if ((rc = write_at(fd, buf + (size_t)k * rec, rec, off, path, err)) != 0) {
				if (ftruncate(fd, off) != 0) {
					/* then the partial record fails its checksum when loaded */
				}
			} else if (++j->done - j->first == d->stall_after)
				sleep(3600);
		}
	}
out:
	file_note(d, rel, head + (size_t)j->done * rec, 1);
	close(fd);
	free(buf);
	enforce_budget(d);
	return rc;
}

/*
 * The load staging of at least bytes, in the job's backend's host memory
 * (or, where that cannot be had, plain memory: kv_move stages it again).
 */
static uint8_t *
load_stage(struct kvdisk *d, const struct kvdisk_job *j, size_t bytes)
{
	if (d->stage != NULL && (d->stage_bytes < bytes || d->stage_free != j->ops->host_free)) {
		d->stage_free(d->stage);
		d->stage = NULL;
	}
	if (d->stage != NULL)
		return d->stage;
	d->stage_bytes = bytes;
	if ((d->stage = j->ops->host_alloc(bytes)) != NULL) {
		d->stage_free = j->ops->host_free;
	} else {
		d->stage = xmalloc(bytes);
		d->stage_free = free;
	}
	return d->stage;
}

/* A load's shared state: its readers take pieces of LOAD_RECORDS records in turn. */
struct load {
	struct kvdisk_job *j;
	int fd;
	size_t head, rec;
	const uint64_t *keys;       /* each record's chained key */
	uint8_t *stage;             /* LOAD_RECORDS records a reader */
	pthread_mutex_t mu;
	int32_t next;               /* the next piece's first record */
	int32_t bad;                /* the first record that failed (read, check or copy), or n */
	int rc;                     /* a copy's error, if one failed */
	char err[ERR_LEN];
};

/* The load's first failure at record i (its lowest counts); rc: a copy's error. */
static void
load_fail(struct load *L, int32_t i, int rc, const char *err)
{
	pthread_mutex_lock(&L->mu);
	if (i < L->bad) {
		L->bad = i;
		L->rc = rc;
		if (rc != 0)
			snprintf(L->err, sizeof L->err, "%s", err);
	}
	pthread_mutex_unlock(&L->mu);
}

/* Reads, checks and copies up piece [i, i + c) in buf; returns how many of its records were good. */
static int32_t
load_piece(struct load *L, uint8_t *buf, int32_t i, int32_t c)
{
	struct kvdisk_job *j = L->j;
	const void *src[LOAD_RECORDS];
	char err[ERR_LEN];
	ssize_t got = pread(L->fd, buf, (size_t)c * L->rec, (off_t)(L->head + (size_t)(j->first + i) * L->rec));
	int32_t k, first, have = got > 0 ? (int32_t)MIN((size_t)c, (size_t)got / L->rec) : 0;  /* whole records only */
	long stall;
	int rc;

	for (k = 0; k < have && rec_valid(j, j->first + i + k, L->keys[i + k], buf + (size_t)k * L->rec); k++)
		src[k] = buf + (size_t)k * L->rec + sizeof(struct rec_head);
	if (k == 0)
		return 0;
	stall = i == 0 ? j->move_stall_ms : 0;
	first = stall > 0 ? 1 : k;  /* the test hook's split (above) */
	pthread_mutex_lock(j->copy_mu);
	rc = j->ops->kv_move(j->be, j->blocks + i, first, NULL, src, err);
	if (rc == 0 && stall > 0)
		kvdisk_move_stall(stall, "disk", j->n);
	if (rc == 0 && first < k)
		rc = j->ops->kv_move(j->be, j->blocks + i + first, k - first, NULL, src + first, err);
	pthread_mutex_unlock(j->copy_mu);
	if (rc != 0) {
		load_fail(L, i, rc, err);
		return 0;
	}
	return k;
}

/* A reader: pieces in turn until none is left or one before the next failed. */
static void *
load_reader(void *arg)
{
	struct load *L = ((void **)arg)[0];
	uint8_t *buf = ((void **)arg)[1];

	for (;;) {
		int32_t i, c, k;

		pthread_mutex_lock(&L->mu);
		i = L->next;
		c = MIN(LOAD_RECORDS, L->bad - i);
		L->next += MAX(c, 0);
		pthread_mutex_unlock(&L->mu);
		if (c <= 0)
			return NULL;
		if ((k = load_piece(L, buf, i, c)) < c)
			load_fail(L, i + k, 0, NULL);
	}
}

/*
 * Loads records [first, first + n) while they check out; j->done = how
 * many. LOAD_READERS threads read pieces of the file's records into
 * staging in the backend's host memory, check them and copy the good ones
 * up; records after the first that fails are not used (their blocks were
 * written, but the engine gives back every block past done).
 */
static int
run_load(struct kvdisk *d, struct kvdisk_job *j, char *err)
{
	char rel[128], path[4096];
	struct load L = { .j = j, .rec = rec_bytes(j->block_bytes), .bad = j->n, .mu = PTHREAD_MUTEX_INITIALIZER };
	pthread_t th[LOAD_READERS];
	void *args[LOAD_READERS][2];
	uint64_t *keys, key = j->prev;
	struct stat st;
	uint8_t *h;
	int fd, started = 0;

	job_paths(d, j, rel, sizeof rel, path, sizeof path);
	j->done = 0;
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		file_note(d, rel, 0, 0);  /* nothing stored: another daemon's session.delete may have removed it */
		return 0;
	}
	L.fd = fd;
	L.head = header_make(j, &h);
	keys = xmalloc((size_t)MAX(j->n, 1) * sizeof *keys);
	for (int32_t i = 0; i < j->n; i++)
		keys[i] = key = kv_chain(key, job_tokens(j, j->first + i));
	L.keys = keys;
	if (header_matches(fd, h, L.head)) {
		L.stage = load_stage(d, j, LOAD_READERS * LOAD_RECORDS * L.rec);
		for (int t = 0; t < LOAD_READERS; t++) {
			args[t][0] = &L, args[t][1] = L.stage + (size_t)t * LOAD_RECORDS * L.rec;
			if (pthread_create(&th[t], NULL, load_reader, args[t]) != 0)
				break;
			started++;
		}
		if (started == 0)
			load_reader(args[0]);  /* no thread to be had: this one reads alone */
		for (int t = 0; t < started; t++)
			pthread_join(th[t], NULL);
		j->done = L.bad;
	}
	futimens(fd, NULL);
	if (fstat(fd, &st) == 0)
		file_note(d, rel, (uint64_t)st.st_size, 1);
	close(fd);
	free(h), free(keys);
	pthread_mutex_destroy(&L.mu);
	if (L.rc != 0)
		snprintf(err, ERR_LEN, "%s", L.err);
	return L.rc;
}

/*
 * Removes the session's files, whatever their identity: every identity
 * directory's, indexed or not (another daemon on the database may have
 * written one, or this one may store nothing).
 */
static void
run_remove(struct kvdisk *d, const struct kvdisk_job *j)
{
	DIR *top = opendir(d->dir);
	struct dirent *a;
	char rel[128];

	while (top != NULL && (a = readdir(top)) != NULL)
		if (tier_name(a->d_name, 0)) {
			snprintf(rel, sizeof rel, "%s/%s.kv", a->d_name, j->name);
			file_remove(d, rel);
		}
	if (top != NULL)
		closedir(top);
}

/* The worker's function: runs a job. */
static void
run_job(struct work *w)
{
	struct kvdisk_job *j = (struct kvdisk_job *)w;

	j->err[0] = '\0';
	if (j->op == KVDISK_WRITE)
		j->rc = run_write(j->disk, j, j->err);
	else if (j->op == KVDISK_LOAD)
		j->rc = run_load(j->disk, j, j->err);
	else
		run_remove(j->disk, j);
}

/* ---- the interface ---- */

/*
 * Takes the directory for this process: 0 and *fd the lock file, held; 0
 * and *fd -1 if another process holds it or it cannot be locked (note says
 * so: then the tier stores nothing); an ERR_* code if the lock file cannot
 * be opened.
 */
static int
lock_dir(const char *dir, int *fd, char *note, char *err)
{
	char path[4096], pid[16];
	ssize_t n;
	int e;

	snprintf(path, sizeof path, "%s/lock", dir);
	if ((*fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0)
		return err_set(err, ERR_IO, "%s: %s", path, strerror(errno));
	if (flock(*fd, LOCK_EX | LOCK_NB) == 0) {
		/* for the message of a daemon that finds it held; the lock does not depend on it */
		n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
		if (ftruncate(*fd, 0) != 0 || pwrite(*fd, pid, (size_t)n, 0) != n) {
			/* then another daemon's message names no pid */
		}
		return 0;
	}
	e = errno;
	n = e == EWOULDBLOCK ? pread(*fd, pid, sizeof pid - 1, 0) : -1;
	pid[MAX(n, 0)] = '\0';
	pid[strcspn(pid, "\n")] = '\0';
	if (e == EWOULDBLOCK)
		snprintf(note, ERR_LEN, "KV directory %.100s is in use by another residentd (pid %s): this daemon "
		    "stores no KV there until restarted alone", dir, pid[0] != '\0' ? pid : "unknown");
	else
		snprintf(note, ERR_LEN, "%.100s: flock: %.80s: this daemon stores no KV on disk", path, strerror(e));
	close(*fd);
	*fd = -1;
	return 0;
}

int
kvdisk_open(const char *dir, uint64_t budget, void (*wake)(void *), void *arg, struct kvdisk **out, char *note,
    char *err)
{
	struct kvdisk *d;
	const char *stall = getenv("RESIDENT_KV_WRITE_STALL");
	int rc, lock_fd = -1;

	note[0] = '\0';
	if (budget > 0 && mkdir(dir, 0700) != 0 && errno != EEXIST)
		return err_set(err, ERR_IO, "%s: %s", dir, strerror(errno));
	if (budget > 0 && (rc = lock_dir(dir, &lock_fd, note, err)) != 0)
		return rc;
	d = xcalloc(1, sizeof *d);
	d->dir = xstrdup(dir);
	d->lock_fd = lock_fd;
	d->budget = lock_fd >= 0 ? budget : 0;
	d->stall_after = stall != NULL ? atol(stall) : -1;
	pthread_mutex_init(&d->mu, NULL);
	if (d->budget > 0) {
		scan(d, note);
		enforce_budget(d);
	}
	if ((rc = worker_start(&d->wk, wake, arg, err)) != 0) {
		kvdisk_close(d);
		return rc;
	}
	*out = d;
	return 0;
}

void
kvdisk_job_free(struct kvdisk_job *j)
{
	if (j == NULL)
		return;
	free(j->identity_text), free(j->tokens);
	free(j->hold != NULL ? j->hold : j->blocks);
	free(j);
}

/* The jobs of a list of finished items, linked through next. */
static struct kvdisk_job *
jobs_of(struct work *w)
{
	struct kvdisk_job *j;

	for (j = (struct kvdisk_job *)w; w != NULL; w = w->next)
		((struct kvdisk_job *)w)->next = (struct kvdisk_job *)w->next;
	return j;
}

void
kvdisk_close(struct kvdisk *d)
{
	struct kvdisk_job *j, *next;

	if (d == NULL)
		return;
	worker_stop(&d->wk);
	for (j = jobs_of(worker_take_done(&d->wk)); j != NULL; j = next) {
		next = j->next;
		kvdisk_job_free(j);
	}
	pthread_mutex_destroy(&d->mu);
	if (d->lock_fd >= 0)
		close(d->lock_fd);  /* lets the directory go */
	if (d->stage != NULL)
		d->stage_free(d->stage);
	free(d->files);
	free(d->dir);
	free(d);
}

int
kvdisk_stores(const struct kvdisk *d)
{
	return d != NULL && d->budget > 0;
}

void
kvdisk_submit(struct kvdisk *d, struct kvdisk_job *j)
{
	j->work.fn = run_job;
	j->work.owner = j->owner;
	j->work.key = 0; /* one key: the tier's jobs run in the order they came */
	j->disk = d;
	worker_submit(&d->wk, &j->work);
}

struct kvdisk_job *
kvdisk_take_done(struct kvdisk *d)
{
	return jobs_of(worker_take_done(&d->wk));
}

struct kvdisk_job *
kvdisk_drain(struct kvdisk *d, const void *owner)
{
	return jobs_of(worker_drain(&d->wk, owner));
}

int32_t
kvdisk_records(struct kvdisk *d, uint64_t identity, const char *identity_text, size_t block_bytes,
    const char *name)
{
	size_t head = head_bytes(identity_text), rec = rec_bytes(block_bytes);
	uint64_t bytes = 0;
	char rel[128];
	int i;

	rel_name(rel, sizeof rel, identity, name);
	pthread_mutex_lock(&d->mu);
	for (i = 0; i < d->n_files; i++)
		if (strcmp(d->files[i].rel, rel) == 0)
			bytes = d->files[i].bytes;
	pthread_mutex_unlock(&d->mu);
	return bytes > head ? (int32_t)MIN((bytes - head) / rec, (uint64_t)INT32_MAX) : 0;
}

void
kvdisk_move_stall(long ms, const char *from, int32_t n)
{
	struct timespec t = { (time_t)(ms / 1000), (ms % 1000) * 1000000L };

	fprintf(stderr, "RESIDENT_KV_MOVE_STALL: a move of %d blocks in from %s has copied its first; "
	    "the rest in %ld ms\n", (int)n, from, ms);
	while (nanosleep(&t, &t) != 0 && errno == EINTR)
		continue;
}

void
kvdisk_usage(struct kvdisk *d, uint64_t *bytes, uint64_t *budget)
{
	pthread_mutex_lock(&d->mu);
	*bytes = d->bytes;
	pthread_mutex_unlock(&d->mu);
	*budget = d->budget;
}
