/*
 * engine_tier.c: an engine's prefix cache beyond its pool. What the K/V
 * depend on besides the tokens (the identity: the model's bytes and the
 * numerics), so that a key or a file of another model is never taken;
 * blocks the pool gives up copied to the host tier, and runs of them
 * brought back, both ways in one copy (kv_move); and the disk tier's jobs
 * for a session's blocks, run on kvdisk.c's thread.
 *
 * RESIDENT_KV_MOVE_STALL=N (tests only; engine.c reads it when the engine
 * is made): a run that comes back from the host tier, and a disk load (its
 * job carries N), copies its first block alone, stops for N ms
 * (kvdisk_move_stall says so on stderr) and then copies the rest, so that a
 * test can kill the daemon in the middle of a move into the pool.
 */
#include "config.h"
#include "engine_int.h"
#include "kvdisk.h"
#include "model.h"
#include "util.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* A file's bytes hashed into the identity: ID_SAMPLES pieces of ID_SAMPLE_BYTES, evenly spread. */
#define ID_SAMPLES 16
#define ID_SAMPLE_BYTES ((int64_t)64 << 10)

/*
 * Adds a file to the identity: its name and what changes whenever its
 * bytes do. Times can be put back (cp -p, rsync -a and tar x keep the
 * modification time, and the size and layout may be the same), but not
 * the change time, and a file written anew has another inode; the sampled
 * bytes (1 MiB at most, read at fixed places) also tell apart files whose
 * filesystem keeps coarse times or reuses inodes.
 */
static void
hash_file(XXH3_state_t *h, const char *name, const char *path, const struct stat *st)
{
	int64_t v[7] = { (int64_t)st->st_size, (int64_t)st->st_mtim.tv_sec, (int64_t)st->st_mtim.tv_nsec,
		(int64_t)st->st_ctim.tv_sec, (int64_t)st->st_ctim.tv_nsec, (int64_t)st->st_ino, (int64_t)st->st_dev };
	int64_t i, off, size = (int64_t)st->st_size;
	uint8_t *buf;
	ssize_t n;
	int fd;

	XXH3_64bits_update(h, name, strlen(name) + 1);
	XXH3_64bits_update(h, v, sizeof v);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return;  /* the model was read from it: the stat above still tells its changes */
	buf = xmalloc((size_t)ID_SAMPLE_BYTES);
	for (i = 0; i < ID_SAMPLES; i++) {
		off = size <= ID_SAMPLE_BYTES ? 0 : (size - ID_SAMPLE_BYTES) * i / (ID_SAMPLES - 1);
		if ((n = pread(fd, buf, (size_t)ID_SAMPLE_BYTES, (off_t)off)) > 0)
			XXH3_64bits_update(h, buf, (size_t)n);
		if (size <= ID_SAMPLE_BYTES)
			break;
	}
	free(buf);
	close(fd);
}

/*
 * A hash of the model file (hash_file), or of every file of a Hugging Face
 * directory in name order; its size and latest modification time too.
 */
static uint64_t
files_hash(const char *path, int64_t *size, int64_t *mtime)
{
	XXH3_state_t *h = XXH3_createState();
	struct dirent **names = NULL;
	struct stat st;
	char sub[4096];
	int n, i;
	uint64_t r;

	XXH3_64bits_reset(h);
	*size = *mtime = 0;
	if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
		hash_file(h, path, path, &st);
		*size = (int64_t)st.st_size, *mtime = (int64_t)st.st_mtim.tv_sec;
	} else if ((n = scandir(path, &names, NULL, alphasort)) >= 0) {
		for (i = 0; i < n; i++) {
			snprintf(sub, sizeof sub, "%s/%s", path, names[i]->d_name);
			if (stat(sub, &st) == 0 && S_ISREG(st.st_mode)) {
				hash_file(h, names[i]->d_name, sub, &st);
				*size += (int64_t)st.st_size;
				*mtime = MAX(*mtime, (int64_t)st.st_mtim.tv_sec);
			}
			free(names[i]);
		}
		free(names);
	}
	r = XXH3_64bits_digest(h);
	XXH3_freeState(h);
	return r;
}

/* A hash of the tensor directory: names, types (the quantization), shapes, sizes. */
static uint64_t
tensors_hash(const struct model_desc *m)
{
	XXH3_state_t *h = XXH3_createState();
	uint64_t r;
	int64_t i;

	XXH3_64bits_reset(h);
	XXH3_64bits_update(h, &m->hp, sizeof m->hp);
	for (i = 0; i < m->n_tensors; i++) {
		const struct model_tensor *t = &m->tensors[i];
		int64_t v[6] = { t->type, t->ne[0], t->ne[1], t->ne[2], t->ne[3], (int64_t)t->bytes };

		XXH3_64bits_update(h, t->name, strlen(t->name) + 1);
		XXH3_64bits_update(h, v, sizeof v);
	}
	r = XXH3_64bits_digest(h);
	XXH3_freeState(h);
	return r;
}

/* Fills e->identity and its text. */
void
tier_identity(struct engine *e)
{
	int64_t size, mtime;
	uint64_t files = files_hash(e->m->path, &size, &mtime);
	char buf[4096 + 256];

	snprintf(buf, sizeof buf, "model %s size %lld mtime %lld files %016llx tensors %016llx; %s%s, kv %s, %zu bytes "
	    "a row", e->m->path, (long long)size, (long long)mtime, (unsigned long long)files,
	    (unsigned long long)tensors_hash(e->m), e->ops->name, e->exact ? " exact" : "",
	    kv_type_name(e->bo.kv_type), e->ops->kv_row_bytes(e->be));
	e->identity_text = xstrdup(buf);
	e->identity = XXH3_64bits(buf, strlen(buf));
}

/*
 * Into the host tier with the blocks tier_evict held back, once their
 * copy out (rc) is done: a failed copy only loses them from the cache.
 */
static void
evicted_done(struct engine *e, int rc)
{
	for (int32_t i = 0; i < e->n_evicted; i++) {
		if (rc != 0)
			kvhost_release(e->host, e->evicted[i]);
		else
			kvhost_put(e->host, e->evicted[i]);
	}
	e->n_evicted = 0;
}

/*
 * Copies out the blocks tier_evict held back, into the host tier; then
 * has spare buffers made ahead, for the next ones and for a run that
 * comes back (kvhost_reserve: on the tier's thread).
 */
void
tier_evict_flush(struct engine *e)
{
	void *dst[HOST_RUN];
	char err[ERR_LEN];
	int rc;

	if (e->n_evicted == 0)
		return;
	for (int32_t i = 0; i < e->n_evicted; i++)
		dst[i] = e->evicted[i]->data;
	pthread_mutex_lock(&e->copy_mu);
	rc = e->ops->kv_move(e->be, e->evicted_blk, e->n_evicted, dst, NULL, err);
	pthread_mutex_unlock(&e->copy_mu);
	evicted_done(e, rc);
	kvhost_reserve(e->host, e->block_bytes, HOST_RUN, e->ops->host_alloc, e->ops->host_free);
}

/*
 * kv.h's evict hook: a block the pool gives up goes to the host tier if it
 * fits. Its copy waits, with up to HOST_RUN others, for the first thing
 * that writes into the pool (tier_evict_flush), or for the copy that
 * brings a run in from the host tier in its place.
 */
void
tier_evict(void *arg, const struct kv_pool *kv, int32_t blk)
{
	struct engine *e = arg;
	const struct kv_block *k = &kv->b[blk];
	struct kvhost_block *h;
	void *data;

	if (e->n_evicted == HOST_RUN)
		tier_evict_flush(e);  /* nothing has written into those yet */
	if ((data = kvhost_buffer(e->host, e->block_bytes, e->ops->host_alloc, e->ops->host_free)) == NULL)
		return;
	h = xcalloc(1, sizeof *h);
	h->data = data, h->bytes = e->block_bytes, h->free_fn = e->ops->host_free;
	h->key = k->key;
	h->prev = k->parent == KV_NONE ? k->root : kv->b[k->parent].key;
	h->root = k->root;
	h->depth = k->depth;
	memcpy(h->tokens, k->tokens, sizeof h->tokens);
	e->evicted[e->n_evicted] = h;
	e->evicted_blk[e->n_evicted++] = blk;
}

/* The host blocks that follow the sequence's own while they hold its tokens, up to upto tokens and n. */
static int32_t
host_run(struct engine *e, const struct seq *s, int32_t upto, struct kvhost_block **run, int32_t n)
{
	uint64_t key = s->key;
	int32_t i = 0, depth;

	for (depth = s->n_keyed; i < n && (depth + 1) * KV_BLOCK_TOKENS <= upto; depth++, i++) {
		const int32_t *t = s->tokens + (size_t)depth * KV_BLOCK_TOKENS;
		uint64_t next = kv_chain(key, t);

		if ((run[i] = kvhost_take(e->host, next, key, s->root, depth, t)) == NULL)
			break;
		key = next;
	}
	return i;
}

/*
 * The blocks after the sequence's own, from the host tier, as far as it
 * has them in a row (up to upto tokens): pool blocks for all, one copy up
 * (pinned memory crosses the bus directly, every block in flight at
 * once), then into the prefix cache, held by the sequence. Returns how
 * many blocks it took; those it could not place stay in host memory.
 */
int32_t
tier_from_host(struct engine *e, struct seq *s, int32_t upto)
{
	struct kvhost_block *run[HOST_RUN];
	const void *src[HOST_RUN];
	void *out[HOST_RUN];
	int32_t blk[HOST_RUN], n, placed, i;
	char err[ERR_LEN];
	int rc = 0;

	if (e->host == NULL || (n = host_run(e, s, upto, run, HOST_RUN)) == 0)
		return 0;
	tier_evict_flush(e);  /* the run's blocks give up at most HOST_RUN: each one's copy out goes with its copy in */
	for (placed = 0; placed < n; placed++) {
		int32_t had = e->n_evicted;

		if ((blk[placed] = kv_alloc(&e->kv)) < 0)
			break;
		src[placed] = run[placed]->data;
		/* a block the pool gave up is the one kv_alloc returned: its old K/V go out as the run's come in */
		out[placed] = e->n_evicted > had ? e->evicted[had]->data : NULL;
	}
	if (placed > 0) {
		int32_t first = e->move_stall_ms > 0 ? 1 : placed;  /* the test hook's split (above) */

		pthread_mutex_lock(&e->copy_mu);
		rc = e->ops->kv_move(e->be, blk, first, out, src, err);
		if (rc == 0 && e->move_stall_ms > 0)
			kvdisk_move_stall(e->move_stall_ms, "host memory", placed);
		if (rc == 0 && first < placed)
			rc = e->ops->kv_move(e->be, blk + first, placed - first, out + first, src + first, err);
		pthread_mutex_unlock(&e->copy_mu);
	}
	evicted_done(e, rc);
	if (rc != 0) {  /* a failed copy: the blocks stay in host memory */
		kv_release(&e->kv, blk, placed);
		placed = 0;
	}
	for (i = 0; i < n; i++) {
		if (i >= placed) {
			kvhost_put(e->host, run[i]);
			continue;
		}
		seq_grow_blocks(s, s->n_blocks + 1);
		s->blocks[s->n_blocks++] = kv_publish(&e->kv, blk[i], s->root, run[i]->key, s->n_keyed ?
		    s->blocks[s->n_keyed - 1] : KV_NONE, s->n_keyed, run[i]->tokens);
		s->n_keyed++;
		s->key = run[i]->key;
		kvhost_release(e->host, run[i]);
	}
	e->st.host_hit += (uint64_t)placed * KV_BLOCK_TOKENS;
	return placed;
}

/* ---- the disk tier ---- */

/* A disk job of the sequence's over its blocks [first, first + n) (their ids come later). */
static struct kvdisk_job *
disk_job(struct engine *e, struct seq *s, enum kvdisk_op op, const char *name, int32_t first, int32_t n)
{
	struct kvdisk_job *j = xcalloc(1, sizeof *j);

	j->op = op;
	snprintf(j->name, sizeof j->name, "%s", name);
	j->owner = e;
	j->seq = s;
	j->ops = e->ops;
	j->be = e->be;
	j->copy_mu = &e->copy_mu;
	j->identity = e->identity;
	j->identity_text = xstrdup(e->identity_text);
	/* the uid's namespace is left out: K/V do not depend on who asked */
	j->prev = kv_chain_n(kv_root(e->identity, 0), s->tokens, first);
	j->block_bytes = e->block_bytes;
	j->move_stall_ms = e->move_stall_ms;
	j->first = first;
	j->n = n;
	j->tokens = xmalloc((size_t)n * KV_BLOCK_TOKENS * sizeof *j->tokens);
	memcpy(j->tokens, s->tokens + (size_t)first * KV_BLOCK_TOKENS, (size_t)n * KV_BLOCK_TOKENS * sizeof *j->tokens);
	return j;
}

int
engine_seq_load(struct engine *e, struct seq *s, const char *name, int32_t upto)
{
	int32_t want = MIN(upto, s->n_tokens - 1) / KV_BLOCK_TOKENS, i, b, have;
	struct kvdisk_job *j;

	if (e->disk == NULL || !s->cache || s->io != NULL || s->state != SEQ_PREFILL ||
	    s->n_blocks != s->n_keyed || s->n_cached != s->n_keyed * KV_BLOCK_TOKENS)
		return 0;
	have = kvdisk_records(e->disk, e->identity, e->identity_text, e->block_bytes, name);
	/* the budget may have removed records this sequence wrote: the next save writes them again */
	s->n_saved = MIN(s->n_saved, have);
	want = MIN(want, have) - s->n_keyed;
	if (want <= 0)
		return 0;
	j = disk_job(e, s, KVDISK_LOAD, name, s->n_keyed, want);
	j->blocks = xmalloc((size_t)want * sizeof *j->blocks);
	for (i = 0; i < want && (b = kv_alloc(&e->kv)) >= 0; i++)
		j->blocks[i] = b;
	if ((j->n = i) == 0) {
		kvdisk_job_free(j);
		return 0;
	}
	s->io = j;
	s->state = SEQ_LOAD;
	e->n_io++;
	tier_evict_flush(e);  /* before the load writes into the blocks they gave up */
	kvdisk_submit(e->disk, j);
	return 1;
}

void
engine_seq_save(struct engine *e, struct seq *s, const char *name)
{
	int32_t first = s->n_saved, n = s->n_keyed - first, i;
	struct kvdisk_job *j;

	if (e->disk == NULL || !s->cache || s->io != NULL || n <= 0 || s->n_parked > first)
		return;
	/* the whole chain, not only the blocks to write: a holder of a cached block holds its chain (kv.h) */
	j = disk_job(e, s, KVDISK_WRITE, name, first, n);
	j->n_hold = s->n_keyed;
	j->hold = xmalloc((size_t)j->n_hold * sizeof *j->hold);
	for (i = 0; i < j->n_hold; i++) {
		j->hold[i] = s->blocks[i];
		kv_ref(&e->kv, j->hold[i]);
	}
	j->blocks = j->hold + first;
	s->io = j;
	e->n_io++;
	kvdisk_submit(e->disk, j);
}

/* A load came back: the sequence takes the blocks that checked out and goes on. */
static void
load_done(struct engine *e, struct seq *s, struct kvdisk_job *j)
{
	int32_t k = j->rc == 0 ? j->done : 0;

	seq_grow_blocks(s, s->n_blocks + k);
	memcpy(s->blocks + s->n_blocks, j->blocks, (size_t)k * sizeof *s->blocks);
	s->n_blocks += k;
	s->n_cached += k * KV_BLOCK_TOKENS;
	seq_publish(e, s);
	kv_release(&e->kv, j->blocks + k, j->n - k);
	s->n_hit += k * KV_BLOCK_TOKENS;
	s->n_saved = MAX(s->n_saved, s->n_keyed);
	e->st.hit += (uint64_t)k * KV_BLOCK_TOKENS;
	e->st.miss -= (uint64_t)k * KV_BLOCK_TOKENS;
	e->st.disk_hit += (uint64_t)k * KV_BLOCK_TOKENS;
	s->state = SEQ_PREFILL;
}

/*
 * A write came back: its records count as saved while the session's
 * tokens still begin with them (a next turn may have departed from them
 * while it ran, cutting n_saved below the write's first record).
 */
static void
write_done(struct seq *s, const struct kvdisk_job *j)
{
	int32_t k = MIN(s->n_saved, j->done);

	if (k == j->first)
		while (k < j->done && k < s->n_keyed && memcmp(j->tokens + (size_t)(k - j->first) * KV_BLOCK_TOKENS,
		    s->tokens + (size_t)k * KV_BLOCK_TOKENS, KV_BLOCK_TOKENS * sizeof *s->tokens) == 0)
			k++;
	s->n_saved = k;
}

void
engine_io_done(struct engine *e, struct kvdisk_job *j)
{
	struct seq *s = j->seq;

	e->n_io--;
	if (s != NULL)
		s->io = NULL;
	if (j->op == KVDISK_LOAD && s != NULL && s->state == SEQ_LOAD)
		load_done(e, s, j);
	else if (j->hold != NULL)
		kv_release(&e->kv, j->hold, j->n_hold);
	else
		kv_release(&e->kv, j->blocks, j->n);
	if (j->op == KVDISK_WRITE && s != NULL)
		write_done(s, j);
	kvdisk_job_free(j);
}