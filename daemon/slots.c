/*
 * slots.c: models loaded on demand within one memory budget, unloaded when
 * unused past their keep-alive or when another needs the memory.
 */
#include "config.h"
#include "slots.h"
#include "model.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void
slots_init(struct slots *sl, const struct slots_opts *o)
{
	memset(sl, 0, sizeof *sl);
	sl->o = *o;
	pthread_mutex_init(&sl->mu, NULL);
}

void
slots_destroy(struct slots *sl)
{
	struct slot *m;

	while ((m = sl->list) != NULL) {
		sl->list = m->next;
		slots_unload(sl, m);
		free(m->name), free(m->path), free(m);
	}
	while (sl->n_known > 0)
		free(sl->known[--sl->n_known]);
	free(sl->known);
	pthread_mutex_destroy(&sl->mu);
}

/* Says why name_or_path names no model: what was looked for, and where. Returns ERR_NOTFOUND. */
static int
model_not_found(const char *name_or_path, int e, char *err)
{
	char cwd[PATH_MAX];

	if (name_or_path[0] == '/' || getcwd(cwd, sizeof cwd) == NULL)
		return err_set(err, ERR_NOTFOUND, "no model named '%s' (model.list has the names), and %s: %s",
		    name_or_path, name_or_path, strerror(e));
	return err_set(err, ERR_NOTFOUND, "no model named '%s' (model.list has the names), and no file "
		    "%s in residentd's directory %s: %s", name_or_path, name_or_path, cwd, strerror(e));
}

/* A new slot for an absolute path (name and path become its). */
static struct slot *
slot_new(struct slots *sl, char *name, char *path)
{
	struct slot *m = xcalloc(1, sizeof *m);

	m->name = name;
	m->path = path;
	m->keep_alive = sl->o.keep_alive;
	m->next = sl->list;
	sl->list = m;
	pthread_mutex_lock(&sl->mu);
	sl->known = xrealloc(sl->known, (size_t)(sl->n_known + 2) * sizeof *sl->known);
	sl->known[sl->n_known++] = xstrdup(m->name);
	sl->known[sl->n_known++] = xstrdup(m->path);
	pthread_mutex_unlock(&sl->mu);
	return m;
}

int
slots_find(struct slots *sl, const char *name_or_path, struct slot **out, char *err)
{
	struct slot *m;
	char *name, *path;
	int rc = 0;

	*out = NULL;
	for (m = sl->list; m != NULL; m = m->next)
		if (strcmp(m->name, name_or_path) == 0 || strcmp(m->path, name_or_path) == 0)
			return *out = m, 0;
	if ((path = realpath(name_or_path, NULL)) == NULL)
		return model_not_found(name_or_path, errno, err);
	name = model_file_name(path);
	for (m = sl->list; m != NULL; m = m->next) {
		if (strcmp(m->path, path) == 0 || strcmp(m->name, name) == 0) {
			if (strcmp(m->path, path) != 0)
				rc = err_set(err, ERR_INVAL, "%s: the model named '%s' is another file (%s)", path,
				    name, m->path);
			free(name), free(path);
			return *out = rc == 0 ? m : NULL, rc;
		}
	}
	*out = slot_new(sl, name, path);
	return 0;
}

int
slots_known(struct slots *sl, const char *name_or_path)
{
	struct stat st;
	int i, found = 0;

	pthread_mutex_lock(&sl->mu);
	for (i = 0; i < sl->n_known && !found; i++)
		found = strcmp(sl->known[i], name_or_path) == 0;
	pthread_mutex_unlock(&sl->mu);
	return found || stat(name_or_path, &st) == 0;
}

void
slots_unload(struct slots *sl, struct slot *m)
{
	if (m->e == NULL)
		return;
	if (sl->o.unloading != NULL)
		sl->o.unloading(sl->o.arg, m);
	sl->used -= engine_mem_bytes(m->e);
	engine_close(m->e);
	m->e = NULL;
	m->unloads++;
	sl->unloads++;
}

/* The loaded slot no request uses that was used least recently, or NULL. */
static struct slot *
lru_unused(struct slots *sl, const struct slot *except)
{
	struct slot *m, *lru = NULL;

	for (m = sl->list; m != NULL; m = m->next)
		if (m->e != NULL && m->users == 0 && m != except && (lru == NULL || m->last_used < lru->last_used))
			lru = m;
	return lru;
}

/* Unloads unused slots, least recently used first, until need bytes of the budget are free. */
static void
make_room(struct slots *sl, const struct slot *m, uint64_t need)
{
	struct slot *lru;

	while (sl->o.budget - MIN(sl->used, sl->o.budget) < need && (lru = lru_unused(sl, m)) != NULL)
		slots_unload(sl, lru);
}

/*
 * A slot that has never loaded and that nothing uses goes once it fails to
 * open: a path that is no model (any file a client names) leaves nothing.
 */
static void
forget_new(struct slots *sl, struct slot *m)
{
	struct slot **pp;
	int i;

	if (m->loads > 0 || m->users > 0 || m->residents != NULL)
		return;
	for (pp = &sl->list; *pp != m; pp = &(*pp)->next)
		;
	*pp = m->next;
	pthread_mutex_lock(&sl->mu);
	for (i = sl->n_known - 1; i >= 0; i--)
		if (strcmp(sl->known[i], m->name) == 0 || strcmp(sl->known[i], m->path) == 0) {
			free(sl->known[i]);
			sl->known[i] = sl->known[--sl->n_known];
		}
	pthread_mutex_unlock(&sl->mu);
	free(m->name), free(m->path), free(m);
}

static int
prepare(const struct slots *sl, const struct slot *m, struct engine **out, char *err)
{
	struct engine_opts eo = sl->o.eo;

	if (m->device != NULL)
		eo.device = m->device;
	return engine_prepare(m->path, &eo, out, err);
}

int
slots_prepare(struct slots *sl, struct slot *m, struct engine **out, char *err)
{
	int rc = prepare(sl, m, out, err);

	if (rc != 0)
		forget_new(sl, m);
	return rc;
}

int
slots_load(struct slots *sl, struct slot *m, void (*progress)(void *, uint64_t, uint64_t), void *arg, char *err)
{
	uint64_t min, whole, want, left, total;
	struct engine *e;
	struct stat st;
	int rc;

	if (m->e != NULL)
		return 0;
	if ((rc = slots_prepare(sl, m, &e, err)) != 0)
		return rc;
	engine_mem_need(e, &min, &whole, &want);
	if (min > sl->o.budget) {
		rc = err_set(err, ERR_NOMEM, "%s needs %.0f MiB of device memory at least; the budget is %.0f MiB "
		    "(residentd --device-memory)", m->name, min / 1048576.0, sl->o.budget / 1048576.0);
		engine_close(e);
		forget_new(sl, m);
		return rc;
	}
	/* unused models give way before any of this one's layers is kept in host memory */
	make_room(sl, m, MIN(whole, sl->o.budget));
	left = sl->o.budget - MIN(sl->used, sl->o.budget);
	if (left < min) {
		engine_close(e);
		return SLOTS_WAIT;
	}
	total = stat(m->path, &st) == 0 ? (uint64_t)st.st_size : 0;
	if (progress != NULL)
		progress(arg, 0, total);
	if ((rc = engine_load(e, MIN(want, left), err)) != 0) {
		engine_close(e);
		forget_new(sl, m);
		return rc;
	}
	if (progress != NULL)
		progress(arg, total, total);
	m->e = e;
	memset(&m->pace, 0, sizeof m->pace);
	memset(&m->guess, 0, sizeof m->guess);
	sl->used += engine_mem_bytes(e);
	m->loads++;
	sl->loads++;
	m->last_used = ++sl->clock;
	m->idle_since = now_ns();
	return 0;
}

void
slots_acquire(struct slots *sl, struct slot *m)
{
	m->users++;
	m->last_used = ++sl->clock;
}

void
slots_release(struct slots *sl, struct slot *m, double keep_alive)
{
	m->users--;
	m->keep_alive = keep_alive;
	m->last_used = ++sl->clock;
	if (m->users == 0)
		m->idle_since = now_ns();
}

double
slots_expires_in(const struct slot *m)
{
	double left;

	if (m->e == NULL || m->users > 0 || m->keep_alive < 0)
		return -1;
	left = m->keep_alive - (double)(now_ns() - m->idle_since) / 1e9;
	return left > 0 ? left : 0;
}

int64_t
slots_expire(struct slots *sl)
{
	struct slot *m;
	int64_t next = -1, ns;
	double left;

	for (m = sl->list; m != NULL; m = m->next) {
		if ((left = slots_expires_in(m)) < 0)
			continue;
		if (left == 0) {
			slots_unload(sl, m);
			continue;
		}
		/* a keep-alive of years is accepted: wake at least daily, within int64 nanoseconds */
		ns = (int64_t)(MIN(left, 86400.0) * 1e9) + 1;
		next = next < 0 ? ns : MIN(next, ns);
	}
	return next;
}
