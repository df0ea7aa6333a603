/*
 * safetensors.c: safetensors reader (one file or an indexed set of shards)
 * and writer.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {...}}), then the data section, offsets relative to its
 * start. The reader checks what the reference implementation checks, the
 * way it does (the offsets, sorted, must tile the data section exactly), so
 * that we accept the files it accepts and nothing that would make us read
 * outside the mapping. After st_open_* succeeds, accessors need no checks.
 */
#include "config.h"
#include "safetensors.h"
#include "quant.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian and is handed out as it is stored"
#endif

#define ST_SINGLE "model.safetensors"
#define ST_INDEX "model.safetensors.index.json"
/* Bytes of a hostile name quoted in an error message. */
#define ST_QUOTE 64

struct st_file {
	char *name;          /* as the index names it (or the path, for one file) */
	char *path;
	const uint8_t *base; /* the mapping */
	size_t size;
};

struct st_entry {
	struct st_tensor t;
	uint64_t begin, end; /* data_offsets */
	uint32_t file;
};

struct st_model {
	struct st_file *files;
	size_t n_files;
	struct st_entry *ents;
	int64_t n, cap;
	struct st_entry **by_name; /* sorted by name, for st_find */
};

struct st_wtensor {
	char *name;
	uint32_t type;
	int n_dims;
	int64_t ne[ST_MAX_DIMS];
	void *data;
	size_t bytes;
};

struct st_writer {
	struct st_wtensor *t;
	size_t n, cap;
};

/* The dtypes we hand out; the order is the writer's sort order (the reference's Dtype order, reversed). */
static const struct {
	const char *name;
	uint32_t type;
	size_t size;
} dtypes[] = {
	{ "F32", TT_F32, 4 },
	{ "BF16", TT_BF16, 2 },
	{ "F16", TT_F16, 2 },
};

/* Index of a dtype in dtypes[] by safetensors name, or -1. */
static int
dtype_by_name(const char *s)
{
	size_t i;

	for (i = 0; i < ARRAY_LEN(dtypes); i++)
		if (strcmp(dtypes[i].name, s) == 0)
			return (int)i;
	return -1;
}

/* Index of a dtype in dtypes[] by tensor type, or -1. */
static int
dtype_by_type(uint32_t type)
{
	size_t i;

	for (i = 0; i < ARRAY_LEN(dtypes); i++)
		if (dtypes[i].type == type)
			return (int)i;
	return -1;
}

/* Copies at most ST_QUOTE bytes of a name from a file into buf, cut between characters, control bytes as '?'. */
static const char *
quote(const char *s, char *buf)
{
	size_t i, n = strnlen(s, ST_QUOTE);

	if (s[n] != '\0')
		while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
			n--;
	for (i = 0; i < n; i++)
		buf[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
	buf[n] = '\0';
	return buf;
}

/* dir + "/" + name, malloc'd. */
static char *
path_join(const char *dir, const char *name)
{
	size_t a = strlen(dir), b = strlen(name);
	char *p = xmalloc(a + b + 2);

	memcpy(p, dir, a);
	p[a] = '/';
	memcpy(p + a + 1, name, b + 1);
	return p;
}

/* Maps a regular file read-only. */
static int
map_file(struct st_file *f, char *err)
{
	struct stat sb;
	void *p;
	int fd;

	if ((fd = open(f->path, O_RDONLY | O_CLOEXEC)) < 0)
		return err_set(err, ERR_IO, "%s: %s", f->path, strerror(errno));
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		close(fd);
		return err_set(err, ERR_IO, "%s: not a regular file", f->path);
	}
	if ((uint64_t)sb.st_size < 8) {
		close(fd);
		return err_set(err, ERR_FORMAT, "%s: %lld bytes is too short for a safetensors file",
		    f->path, (long long)sb.st_size);
	}
	p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return err_set(err, ERR_IO, "%s: mmap: %s", f->path, strerror(errno));
	f->base = p;
	f->size = (size_t)sb.st_size;
	return 0;
}

/* Adds a file (not yet mapped) to the model; returns its index. */
static uint32_t
add_file(struct st_model *m, const char *name, char *path)
{
	struct st_file *f;

	m->files = xrealloc(m->files, (m->n_files + 1) * sizeof *m->files);
	f = &m->files[m->n_files];
	memset(f, 0, sizeof *f);
	f->name = xstrdup(name);
	f->path = path;
	return (uint32_t)m->n_files++;
}

/* A new, zeroed tensor entry. */
static struct st_entry *
add_entry(struct st_model *m)
{
	if (m->n == m->cap) {
		m->cap = m->cap ? m->cap * 2 : 64;
		m->ents = xrealloc(m->ents, (size_t)m->cap * sizeof *m->ents);
	}
	memset(&m->ents[m->n], 0, sizeof m->ents[m->n]);
	return &m->ents[m->n++];
}

/* A non-negative JSON integer. */
static int
json_u64(const json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

/* Reads "shape" into e: reversed into GGML order, element count overflow-checked. */
static int
parse_shape(struct st_entry *e, const json_t *shape, const char *path, const char *qn, char *err)
{
	size_t i, n, count = 1;
	uint64_t d;

	if (!json_is_array(shape))
		return err_set(err, ERR_FORMAT, "%s: tensor '%s': shape is not an array", path, qn);
	if ((n = json_array_size(shape)) > ST_MAX_DIMS)
		return err_set(err, ERR_UNSUPPORTED, "%s: tensor '%s' has %zu dimensions (at most %d)",
		    path, qn, n, ST_MAX_DIMS);
	e->t.n_dims = (int)n;
	for (i = 0; i < ST_MAX_DIMS; i++)
		e->t.ne[i] = 1;
	for (i = 0; i < n; i++) {
		if (json_u64(json_array_get(shape, i), &d) != 0)
			return err_set(err, ERR_FORMAT, "%s: tensor '%s': dimension %zu is not a "
			    "non-negative integer", path, qn, i);
		if (mul_size(count, (size_t)d, &count) != 0 || count > INT64_MAX)
			return err_set(err, ERR_FORMAT, "%s: tensor '%s': element count overflows", path, qn);
		e->t.ne[n - 1 - i] = (int64_t)d;
	}
	e->t.n_elems = (int64_t)count;
	return 0;
}

/* Reads "data_offsets" into e and checks they span shape x dtype bytes. */
static int
parse_offsets(struct st_entry *e, const json_t *offs, size_t esize, const char *path,
    const char *qn, char *err)
{
	if (!json_is_array(offs) || json_array_size(offs) != 2 ||
	    json_u64(json_array_get(offs, 0), &e->begin) != 0 ||
	    json_u64(json_array_get(offs, 1), &e->end) != 0)
		return err_set(err, ERR_FORMAT, "%s: tensor '%s': data_offsets is not a pair of "
		    "non-negative integers", path, qn);
	if (e->end < e->begin)
		return err_set(err, ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end "
		    "before they begin", path, qn, (unsigned long long)e->begin,
		    (unsigned long long)e->end);
	if (mul_size((size_t)e->t.n_elems, esize, &e->t.bytes) != 0 ||
	    e->end - e->begin != e->t.bytes)
		return err_set(err, ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] do not "
		    "span its %lld elements of %zu bytes", path, qn, (unsigned long long)e->begin,
		    (unsigned long long)e->end, (long long)e->t.n_elems, esize);
	return 0;
}

/* Parses one header entry into a new tensor of file fi. */
static int
parse_entry(struct st_model *m, uint32_t fi, const char *name, const json_t *v, char *err)
{
	const char *path = m->files[fi].path, *ds;
	char qn[ST_QUOTE + 1];
	struct st_entry *e;
	int d, rc;

	quote(name, qn);
	if (*name == '\0')
		return err_set(err, ERR_FORMAT, "%s: a tensor has an empty name", path);
	if (!json_is_object(v))
		return err_set(err, ERR_FORMAT, "%s: tensor '%s' is not an object", path, qn);
	if ((ds = json_string_value(json_object_get(v, "dtype"))) == NULL)
		return err_set(err, ERR_FORMAT, "%s: tensor '%s' has no dtype string", path, qn);
	if ((d = dtype_by_name(ds)) < 0) {
		char qd[ST_QUOTE + 1];

		return err_set(err, ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (only F32, F16 "
		    "and BF16 are supported)", path, qn, quote(ds, qd));
	}
	e = add_entry(m);
	e->t.name = xstrdup(name);
	e->t.type = dtypes[d].type;
	e->file = fi;
	if ((rc = parse_shape(e, json_object_get(v, "shape"), path, qn, err)) != 0)
		return rc;
	return parse_offsets(e, json_object_get(v, "data_offsets"), dtypes[d].size, path, qn, err);
}

/* Orders entries by data_offsets. */
static int
cmp_offsets(const void *a, const void *b)
{
	const struct st_entry *x = a, *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return 0;
}

/*
 * Sorts a file's entries into file order and checks they tile its data
 * section from 0 to the end, as the reference reader requires: no gap, no
 * overlap, nothing past the end. Sets the data pointers.
 */
static int
check_layout(struct st_model *m, int64_t from, const uint8_t *data, uint64_t size, const char *path,
    char *err)
{
	struct st_entry *e;
	uint64_t at = 0;
	char qn[ST_QUOTE + 1];
	int64_t i;

	if (m->n > from)
		qsort(m->ents + from, (size_t)(m->n - from), sizeof *m->ents, cmp_offsets);
	for (i = from; i < m->n; i++) {
		e = &m->ents[i];
		if (e->begin != at)
			return err_set(err, ERR_FORMAT, "%s: tensor '%s' at data offset %llu %s the "
			    "previous tensor, which ends at %llu", path, quote(e->t.name, qn),
			    (unsigned long long)e->begin, e->begin < at ? "overlaps" : "leaves a gap after",
			    (unsigned long long)at);
		if (e->end > size)
			return err_set(err, ERR_FORMAT, "%s: tensor '%s' ends at data offset %llu, past the "
			    "%llu bytes of data in the file", path, quote(e->t.name, qn), (unsigned long long)e->end,
			    (unsigned long long)size);
		e->t.data = data + e->begin;
		at = e->end;
	}
	if (at != size)
		return err_set(err, ERR_FORMAT, "%s: the tensors cover %llu of the %llu bytes of data",
		    path, (unsigned long long)at, (unsigned long long)size);
	return 0;
}

/* Checks the header length field against the file; sets *hlen. */
static int
header_len(const struct st_file *f, uint64_t *hlen, char *err)
{
	uint64_t n = 0;
	int i;

	for (i = 7; i >= 0; i--)
		n = (n << 8) | f->base[i];
	if (n > ST_MAX_HEADER)
		return err_set(err, ERR_FORMAT, "%s: header length %llu is over the %u-byte limit",
		    f->path, (unsigned long long)n, ST_MAX_HEADER);
	if (n > f->size - 8)
		return err_set(err, ERR_FORMAT, "%s: header length %llu is past the end of the "
		    "%zu-byte file (truncated?)", f->path, (unsigned long long)n, f->size);
	if (n < 2 || f->base[8] != '{')
		return err_set(err, ERR_FORMAT, "%s: the header is not a JSON object", f->path);
	*hlen = n;
	return 0;
}

/* Maps file fi, parses its header and checks every tensor against it. */
static int
parse_file(struct st_model *m, uint32_t fi, char *err)
{
	struct st_file *f = &m->files[fi];
	json_error_t jerr;
	json_t *root, *v;
	const char *key;
	uint64_t hlen = 0;
	int64_t from = m->n;
	int rc = 0;

	if ((rc = map_file(f, err)) != 0 || (rc = header_len(f, &hlen, err)) != 0)
		return rc;
	root = json_loadb((const char *)f->base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
	if (root == NULL)
		return err_set(err, ERR_FORMAT, "%s: header is not valid JSON: %s (column %d)",
		    f->path, jerr.text, jerr.column);
	if (!json_is_object(root))
		rc = err_set(err, ERR_FORMAT, "%s: the header is not a JSON object", f->path);
	json_object_foreach(root, key, v) {
		if (rc != 0)
			break;
		if (strcmp(key, "__metadata__") != 0)
			rc = parse_entry(m, fi, key, v, err);
	}
	json_decref(root);
	if (rc != 0)
		return rc;
	return check_layout(m, from, f->base + 8 + hlen, f->size - 8 - hlen, f->path, err);
}

/* Orders entry pointers by name. */
static int
cmp_names(const void *a, const void *b)
{
	const struct st_entry *const *x = a, *const *y = b;

	return strcmp((*x)->t.name, (*y)->t.name);
}

/* Builds the name index; a name in two shards is an error. */
static int
index_names(struct st_model *m, char *err)
{
	char qn[ST_QUOTE + 1];
	int64_t i;

	m->by_name = xcalloc((size_t)(m->n ? m->n : 1), sizeof *m->by_name);
	for (i = 0; i < m->n; i++)
		m->by_name[i] = &m->ents[i];
	qsort(m->by_name, (size_t)m->n, sizeof *m->by_name, cmp_names);
	for (i = 1; i < m->n; i++)
		if (strcmp(m->by_name[i - 1]->t.name, m->by_name[i]->t.name) == 0)
			return err_set(err, ERR_FORMAT, "tensor '%s' is in both %s and %s",
			    quote(m->by_name[i]->t.name, qn), m->files[m->by_name[i - 1]->file].path,
			    m->files[m->by_name[i]->file].path);
	return 0;
}

/* 0 if an index may name this shard: a plain file name in the directory, no path. */
static int
check_shard_name(const char *name, const char *index, char *err)
{
	char qn[ST_QUOTE + 1];

	if (*name == '\0' || strcmp(name, ".") == 0 || strchr(name, '/') != NULL ||
	    strstr(name, "..") != NULL)
		return err_set(err, ERR_FORMAT, "%s: shard name '%s' is not a file name in the model "
		    "directory", index, quote(name, qn));
	return 0;
}

/* Reads the index file (size-checked) and returns its weight_map's parent; *wm is borrowed from it. */
static int
load_index(const char *path, json_t **root, json_t **wm, char *err)
{
	struct stat sb;
	json_error_t jerr;
	char *buf;
	size_t len;
	int rc;

	if (stat(path, &sb) != 0)
		return err_set(err, ERR_IO, "%s: %s", path, strerror(errno));
	if ((uint64_t)sb.st_size > ST_MAX_HEADER)
		return err_set(err, ERR_FORMAT, "%s: %lld bytes is over the %u-byte limit", path,
		    (long long)sb.st_size, ST_MAX_HEADER);
	if ((rc = read_file(path, &buf, &len, err)) != 0)
		return rc;
	*root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	free(buf);
	if (*root == NULL)
		return err_set(err, ERR_FORMAT, "%s: line %d: %s", path, jerr.line, jerr.text);
	*wm = json_object_get(*root, "weight_map");
	if (!json_is_object(*wm) || json_object_size(*wm) == 0)
		return err_set(err, ERR_FORMAT, "%s: no weight_map object listing tensors", path);
	return 0;
}

/* Orders C strings. */
static int
cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Adds every distinct shard the weight map names, in name order, after checking each name. */
static int
add_shards(struct st_model *m, const char *dir, const char *index, json_t *wm, char *err)
{
	const char **names = xcalloc(json_object_size(wm), sizeof *names);
	const char *key;
	json_t *v;
	size_t n = 0, i;
	int rc = 0;

	json_object_foreach(wm, key, v) {
		if ((names[n++] = json_string_value(v)) == NULL) {
			char qn[ST_QUOTE + 1];

			rc = err_set(err, ERR_FORMAT, "%s: the shard of tensor '%s' is not a string",
			    index, quote(key, qn));
			break;
		}
		if ((rc = check_shard_name(names[n - 1], index, err)) != 0)
			break;
	}
	if (rc == 0) {
		qsort(names, n, sizeof *names, cmp_str);
		for (i = 0; i < n; i++)
			if (i == 0 || strcmp(names[i], names[i - 1]) != 0)
				add_file(m, names[i], path_join(dir, names[i]));
	}
	free(names);
	return rc;
}

/* Checks the index and the shards agree: each tensor where the index says, and nothing more. */
static int
check_index(const struct st_model *m, const char *index, json_t *wm, char *err)
{
	char qn[ST_QUOTE + 1];
	const char *key, *shard;
	json_t *v;
	int64_t i;

	json_object_foreach(wm, key, v) {
		if (st_find(m, key) == NULL)
			return err_set(err, ERR_FORMAT, "%s: tensor '%s' is not in its shard %s", index,
			    quote(key, qn), json_string_value(v));
	}
	for (i = 0; i < m->n; i++) {
		shard = json_string_value(json_object_get(wm, m->ents[i].t.name));
		if (shard == NULL || strcmp(shard, m->files[m->ents[i].file].name) != 0)
			return err_set(err, ERR_FORMAT, "%s: tensor '%s' of shard %s is %s", index,
			    quote(m->ents[i].t.name, qn), m->files[m->ents[i].file].name,
			    shard ? "listed in another shard" : "not listed");
	}
	return 0;
}

/* Opens the shards an index lists. */
static int
open_index(struct st_model *m, const char *dir, const char *index, char *err)
{
	json_t *root = NULL, *wm;
	size_t i;
	int rc;

	if ((rc = load_index(index, &root, &wm, err)) == 0 &&
	    (rc = add_shards(m, dir, index, wm, err)) == 0) {
		for (i = 0; i < m->n_files && rc == 0; i++)
			rc = parse_file(m, (uint32_t)i, err);
		if (rc == 0 && (rc = index_names(m, err)) == 0)
			rc = check_index(m, index, wm, err);
	}
	json_decref(root);
	return rc;
}

int
st_open_file(const char *path, struct st_model **out, char *err)
{
	struct st_model *m = xcalloc(1, sizeof *m);
	int rc;

	add_file(m, path, xstrdup(path));
	if ((rc = parse_file(m, 0, err)) == 0)
		rc = index_names(m, err);
	if (rc != 0) {
		st_close(m);
		return rc;
	}
	*out = m;
	return 0;
}

int
st_open_dir(const char *dir, struct st_model **out, char *err)
{
	char *single = path_join(dir, ST_SINGLE), *index = path_join(dir, ST_INDEX);
	struct st_model *m;
	struct stat sb;
	int rc;

	if (stat(single, &sb) == 0) {
		rc = st_open_file(single, out, err);
	} else if (stat(index, &sb) == 0) {
		m = xcalloc(1, sizeof *m);
		if ((rc = open_index(m, dir, index, err)) != 0)
			st_close(m);
		else
			*out = m;
	} else {
		rc = err_set(err, ERR_NOTFOUND, "%s: no " ST_SINGLE " or " ST_INDEX, dir);
	}
	free(single);
	free(index);
	return rc;
}

void
st_close(struct st_model *m)
{
	size_t i;
	int64_t j;

	if (m == NULL)
		return;
	for (i = 0; i < m->n_files; i++) {
		if (m->files[i].base != NULL)
			munmap((void *)m->files[i].base, m->files[i].size);
		free(m->files[i].name);
		free(m->files[i].path);
	}
	for (j = 0; j < m->n; j++)
		free((char *)m->ents[j].t.name);
	free(m->files);
	free(m->ents);
	free(m->by_name);
	free(m);
}

int64_t
st_n_tensors(const struct st_model *m)
{
	return m->n;
}

const struct st_tensor *
st_tensor(const struct st_model *m, int64_t i)
{
	if (i < 0 || i >= m->n)
		return NULL;
	return &m->ents[i].t;
}

/* Compares a name with an entry pointer, for bsearch. */
static int
cmp_key(const void *key, const void *elem)
{
	return strcmp(key, (*(struct st_entry *const *)elem)->t.name);
}

const struct st_tensor *
st_find(const struct st_model *m, const char *name)
{
	struct st_entry *const *e;

	if (m->n == 0)
		return NULL;
	e = bsearch(name, m->by_name, (size_t)m->n, sizeof *m->by_name, cmp_key);
	return e ? &(*e)->t : NULL;
}

/* ---- writer ---- */

struct st_writer *
st_writer_new(void)
{
	return xcalloc(1, sizeof(struct st_writer));
}

void
st_writer_free(struct st_writer *w)
{
	size_t i;

	if (w == NULL)
		return;
	for (i = 0; i < w->n; i++) {
		free(w->t[i].name);
		free(w->t[i].data);
	}
	free(w->t);
	free(w);
}

/* Checks a name for the writer: non-empty, UTF-8 without control characters, new. */
static int
check_w_name(const struct st_writer *w, const char *name, char *err)
{
	size_t i, len;

	if (name == NULL || *name == '\0')
		return err_set(err, ERR_INVAL, "a tensor needs a name");
	len = strlen(name);
	if (!utf8_valid(name, len) || strcmp(name, "__metadata__") == 0)
		return err_set(err, ERR_INVAL, "'%.64s' cannot name a tensor", name);
	for (i = 0; i < len; i++)
		if ((unsigned char)name[i] < 0x20)
			return err_set(err, ERR_INVAL, "tensor name '%.64s' has a control character", name);
	for (i = 0; i < w->n; i++)
		if (strcmp(w->t[i].name, name) == 0)
			return err_set(err, ERR_INVAL, "tensor '%.64s' is added twice", name);
	return 0;
}

int
st_w_tensor(struct st_writer *w, const char *name, uint32_t type,
    int n_dims, const int64_t *ne, const void *data, size_t bytes, char *err)
{
	struct st_wtensor *t;
	size_t count = 1, want;
	int i, d, rc;

	if ((rc = check_w_name(w, name, err)) != 0)
		return rc;
	if ((d = dtype_by_type(type)) < 0)
		return err_set(err, ERR_INVAL, "%.64s: type %u cannot be written (F32, F16, BF16 can)",
		    name, type);
	if (n_dims < 0 || n_dims > ST_MAX_DIMS)
		return err_set(err, ERR_INVAL, "%.64s: %d dimensions (0 to %d)", name, n_dims, ST_MAX_DIMS);
	for (i = 0; i < n_dims; i++)
		if (ne[i] < 0 || mul_size(count, (size_t)ne[i], &count) != 0)
			return err_set(err, ERR_INVAL, "%.64s: bad dimension %lld", name, (long long)ne[i]);
	if (mul_size(count, dtypes[d].size, &want) != 0 || want != bytes || (bytes && data == NULL))
		return err_set(err, ERR_INVAL, "%.64s: %zu bytes of data for %zu elements of %zu bytes",
		    name, bytes, count, dtypes[d].size);
	if (w->n == w->cap) {
		w->cap = w->cap ? w->cap * 2 : 16;
		w->t = xrealloc(w->t, w->cap * sizeof *w->t);
	}
	t = &w->t[w->n++];
	memset(t, 0, sizeof *t);
	t->name = xstrdup(name);
	t->type = type;
	t->n_dims = n_dims;
	for (i = 0; i < n_dims; i++)
		t->ne[i] = ne[i];
	t->data = xmalloc(bytes);
	if (bytes)
		memcpy(t->data, data, bytes);
	t->bytes = bytes;
	return 0;
}

/* The reference writer's order: dtype (F32, BF16, F16: each tensor stays aligned), then name. */
static int
cmp_wtensors(const void *a, const void *b)
{
	const struct st_wtensor *const *x = a, *const *y = b;
	int dx = dtype_by_type((*x)->type), dy = dtype_by_type((*y)->type);

	if (dx != dy)
		return dx - dy;
	return strcmp((*x)->name, (*y)->name);
}

/* The header JSON for tensors in this order, compact, as serde_json writes it. */
static char *
header_json(struct st_wtensor **order, size_t n)
{
	json_t *root = json_object(), *info, *shape;
	uint64_t at = 0;
	size_t i;
	char *s;
	int d;

	json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", "pt"));
	for (i = 0; i < n; i++) {
		shape = json_array();
		for (d = order[i]->n_dims - 1; d >= 0; d--)
			json_array_append_new(shape, json_integer(order[i]->ne[d]));
		info = json_pack("{s:s, s:o, s:[I,I]}", "dtype",
		    dtypes[dtype_by_type(order[i]->type)].name, "shape", shape, "data_offsets",
		    (json_int_t)at, (json_int_t)(at + order[i]->bytes));
		json_object_set_new(root, order[i]->name, info);
		at += order[i]->bytes;
	}
	s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(root);
	if (s == NULL)
		fatal("out of memory encoding a safetensors header");
	return s;
}

/* Writes the length, the header padded with spaces to 8 bytes, then the data. */
static int
write_all(FILE *fp, const char *json, struct st_wtensor **order, size_t n)
{
	static const char spaces[] = "       "; /* the most padding: 7 */
	size_t len = strlen(json), pad = (8 - len % 8) % 8, i;
	uint64_t hlen = len + pad;
	uint8_t le[8];
	int b;

	for (b = 0; b < 8; b++)
		le[b] = (uint8_t)(hlen >> (8 * b));
	if (fwrite(le, 1, 8, fp) != 8 || fwrite(json, 1, len, fp) != len ||
	    fwrite(spaces, 1, pad, fp) != pad)
		return -1;
	for (i = 0; i < n; i++)
		if (fwrite(order[i]->data, 1, order[i]->bytes, fp) != order[i]->bytes)
			return -1;
	return 0;
}

int
st_writer_save(struct st_writer *w, const char *path, char *err)
{
	struct st_wtensor **order = xcalloc(w->n ? w->n : 1, sizeof *order);
	char *json, *tmp = xmalloc(strlen(path) + 5);
	FILE *fp;
	size_t i;
	int rc = 0;

	for (i = 0; i < w->n; i++)
		order[i] = &w->t[i];
	qsort(order, w->n, sizeof *order, cmp_wtensors);
	json = header_json(order, w->n);
	sprintf(tmp, "%s.tmp", path);
	if ((fp = fopen(tmp, "wb")) == NULL) {
		rc = err_set(err, ERR_IO, "%s: %s", tmp, strerror(errno));
	} else {
		if (write_all(fp, json, order, w->n) != 0)
			rc = err_set(err, ERR_IO, "%s: write: %s", tmp, strerror(errno));
		if (fclose(fp) != 0 && rc == 0)
			rc = err_set(err, ERR_IO, "%s: close: %s", tmp, strerror(errno));
		if (rc == 0 && rename(tmp, path) != 0)
			rc = err_set(err, ERR_IO, "%s: rename: %s", path, strerror(errno));
		if (rc != 0)
			unlink(tmp);
	}
	free(json);
	free(tmp);
	free(order);
	return rc;
}
