/*
 * test_store.c: the session store, on real SQLite files in a temporary
 * directory.
 *
 * The binary is linked with -Wl,--wrap=sqlite3_step: every sqlite3_step
 * made by store.c (and by this file) goes through __wrap_sqlite3_step,
 * which can fail the n-th call with an I/O error, or kill the process just
 * before it. The error and crash tests walk n over every step of a call, so
 * that each point a transaction can stop at is tried.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "store.h"
#include "util.h"

int __real_sqlite3_step(sqlite3_stmt *st);
int __wrap_sqlite3_step(sqlite3_stmt *st);

static int step_calls; /* sqlite3_step calls since arm() */
static int fail_at;    /* the call to fail with SQLITE_IOERR; 0: none */
static int kill_at;    /* the call before which to die; 0: none */
static int die_by_exit; /* die by _exit(0) rather than SIGKILL */

int
__wrap_sqlite3_step(sqlite3_stmt *st)
{
	step_calls++;
	if (kill_at != 0 && step_calls == kill_at) {
		if (die_by_exit)
			_exit(0);
		raise(SIGKILL);
	}
	if (fail_at != 0 && step_calls == fail_at)
		return SQLITE_IOERR;
	return __real_sqlite3_step(st);
}

/* Starts counting steps, failing or dying at the given ones (0: never). */
static void
arm(int fail, int kill)
{
	step_calls = 0;
	fail_at = fail;
	kill_at = kill;
}

struct fx {
	char dir[256];
	char path[512];
	struct store *s;
	char err[ERR_LEN];
};

/* ---- helpers ---- */

static int
rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	return remove(path);
}

static int teardown(void **state);

static int
setup(void **state)
{
	struct fx *f = calloc(1, sizeof *f);
	const char *tmp = getenv("TMPDIR");

	if (f == NULL)
		return -1;
	snprintf(f->dir, sizeof f->dir, "%s/test_store.XXXXXX", tmp ? tmp : "/tmp");
	if (mkdtemp(f->dir) == NULL)
		return -1;
	snprintf(f->path, sizeof f->path, "%s/resident.db", f->dir);
	*state = f;
	if (store_open(f->path, &f->s, f->err) != 0) {
		fprintf(stderr, "store_open: %s\n", f->err);
		teardown(state);
		return -1;
	}
	return 0;
}

static int
teardown(void **state)
{
	struct fx *f = *state;

	arm(0, 0);
	store_close(f->s);
	nftw(f->dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
	free(f);
	return 0;
}

/* Closes and opens the fixture's store again. */
static void
reopen(struct fx *f)
{
	store_close(f->s);
	f->s = NULL;
	assert_int_equal(store_open(f->path, &f->s, f->err), 0);
}

/* A second, plain connection to the database, as the sqlite3 CLI would be. */
static sqlite3 *
raw_open(const char *path)
{
	sqlite3 *db = NULL;

	assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE |
	    SQLITE_OPEN_CREATE, NULL), SQLITE_OK);
	sqlite3_busy_timeout(db, 5000);
	return db;
}

/* Runs SQL (a printf format for sqlite3_mprintf: %Q quotes) that must work. */
static void
raw_exec(sqlite3 *db, const char *fmt, ...)
{
	va_list ap;
	char *sql, *msg = NULL;
	int rc;

	va_start(ap, fmt);
	sql = sqlite3_vmprintf(fmt, ap);
	va_end(ap);
	rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
	if (rc != SQLITE_OK)
		fail_msg("%s: %s", sql, msg);
	sqlite3_free(sql);
}

/*
 * Makes the fixture's database one that an older schema version wrote (from
 * a current one) and opens it again, which migrates it: version 2's turns
 * have no tool_calls, tool_call_id or tool_name; version 1's no reasoning either.
 */
static void
reopen_as_version(struct fx *f, int version)
{
	sqlite3 *db;

	store_close(f->s);
	f->s = NULL;
	db = raw_open(f->path);
	raw_exec(db, "ALTER TABLE turns DROP COLUMN tool_calls; ALTER TABLE turns DROP COLUMN tool_call_id;"
	    "ALTER TABLE turns DROP COLUMN tool_name;%s PRAGMA user_version = %d",
	    version < 2 ? " ALTER TABLE turns DROP COLUMN reasoning;" : "", version);
	sqlite3_close(db);
	reopen(f);
}

/* The one integer a query returns (-1 for no row). */
static int64_t
raw_int(sqlite3 *db, const char *fmt, ...)
{
	sqlite3_stmt *st;
	va_list ap;
	char *sql;
	int64_t v = -1;
	int rc;

	va_start(ap, fmt);
	sql = sqlite3_vmprintf(fmt, ap);
	va_end(ap);
	assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		v = sqlite3_column_int64(st, 0);
	else
		assert_int_equal(rc, SQLITE_DONE);
	sqlite3_finalize(st);
	sqlite3_free(sql);
	return v;
}

/* The one text a query returns, copied into buf ("" for no row). */
static char *
raw_text(sqlite3 *db, char *buf, size_t len, const char *fmt, ...)
{
	sqlite3_stmt *st;
	va_list ap;
	char *sql;

	va_start(ap, fmt);
	sql = sqlite3_vmprintf(fmt, ap);
	va_end(ap);
	assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
	buf[0] = '\0';
	if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) != NULL)
		snprintf(buf, len, "%s", (const char *)sqlite3_column_text(st, 0));
	sqlite3_finalize(st);
	sqlite3_free(sql);
	return buf;
}

static struct store_turn
turn(const char *role, const char *content, int32_t *tokens, int32_t n)
{
	struct store_turn t = { .role = (char *)role, .content = (char *)content, .tokens = tokens, .n_tokens = n };

	return t;
}

/* uid's session count as the store lists it. */
static int
list_count(struct fx *f, uint32_t uid)
{
	struct store_session *ss;
	int n;

	assert_int_equal(store_session_list(f->s, uid, 1000, 0, &ss, &n, f->err), 0);
	store_sessions_free(ss, n);
	return n;
}

/* A new session of uid whose uuid goes to uuid. */
static void
new_session(struct fx *f, uint32_t uid, const char *title, char uuid[37])
{
	struct store_session ss;

	assert_int_equal(store_session_new(f->s, uid, "tiny", title, "", NULL, &ss,
	    f->err), 0);
	memcpy(uuid, ss.uuid, 37);
	store_session_clear(&ss);
}

/* A uuid of the right form that no session has. */
static const char missing_uuid[] = "0123abcd-0000-4000-8000-00000000beef";

/* ---- tests ---- */

/* A fresh path: directories 0700, file 0600, WAL, current schema. */
static void
test_open_creates(void **state)
{
	struct fx *f = *state;
	char dir[PATH_MAX], path[PATH_MAX], buf[32];
	struct store *s;
	struct stat sb;
	sqlite3 *db;

	snprintf(dir, sizeof dir, "%s/a", f->dir);
	snprintf(path, sizeof path, "%s/a/b/resident.db", f->dir);
	assert_int_equal(store_open(path, &s, f->err), 0);
	assert_int_equal(stat(dir, &sb), 0);
	assert_int_equal(sb.st_mode & 0777, 0700);
	snprintf(dir, sizeof dir, "%s/a/b", f->dir);
	assert_int_equal(stat(dir, &sb), 0);
	assert_int_equal(sb.st_mode & 0777, 0700);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_mode & 0777, 0600);

	db = raw_open(path);
	assert_int_equal(raw_int(db, "PRAGMA user_version"), store_schema_version());
	assert_string_equal(raw_text(db, buf, sizeof buf, "PRAGMA journal_mode"), "wal");
	assert_int_equal(raw_int(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
	    " AND name IN ('sessions', 'turns', 'models')"), 3);
	sqlite3_close(db);
	store_close(s);

	/* opening again changes nothing */
	assert_int_equal(store_open(path, &s, f->err), 0);
	store_close(s);
	store_close(NULL);

	assert_int_equal(store_open("", &s, f->err), ERR_INVAL);
	assert_null(s);
	/* a parent that is a file */
	snprintf(path, sizeof path, "%s/resident.db/x.db", f->dir);
	assert_true(store_open(path, &s, f->err) < 0);
	assert_null(s);
}

/* new, get, list, rename, delete. */
static void
test_session_crud(void **state)
{
	struct fx *f = *state;
	struct store_session a, b, g, *ss;
	time_t t0 = time(NULL), t1;
	int n;

	assert_int_equal(store_session_new(f->s, 1, "tiny", "First", "Be brief.",
	    "{\"temperature\":0.2}", &a, f->err), 0);
	t1 = time(NULL);
	assert_int_equal(strlen(a.uuid), 36);
	assert_int_equal(a.uuid[14], '4');
	assert_non_null(strchr("89ab", a.uuid[19]));
	assert_int_equal(a.uid, 1);
	assert_string_equal(a.model, "tiny");
	assert_string_equal(a.title, "First");
	assert_string_equal(a.system, "Be brief.");
	assert_string_equal(a.defaults, "{\"temperature\":0.2}");
	assert_true(a.created >= t0 && a.created <= t1);
	assert_int_equal(a.updated, a.created);
	assert_int_equal(a.n_tokens, 0);
	assert_int_equal(a.n_turns, 0);

	/* NULL strings: "" and no defaults */
	assert_int_equal(store_session_new(f->s, 1, NULL, NULL, NULL, NULL, &b, f->err), 0);
	assert_string_not_equal(a.uuid, b.uuid);
	assert_string_equal(b.model, "");
	assert_string_equal(b.title, "");
	assert_string_equal(b.system, "");
	assert_null(b.defaults);

	assert_int_equal(store_session_get(f->s, 1, a.uuid, &g, f->err), 0);
	assert_string_equal(g.uuid, a.uuid);
	assert_string_equal(g.title, "First");
	assert_string_equal(g.defaults, a.defaults);
	assert_int_equal(g.created, a.created);
	store_session_clear(&g);

	assert_int_equal(store_session_list(f->s, 1, 10, 0, &ss, &n, f->err), 0);
	assert_int_equal(n, 2);
	assert_string_equal(ss[0].uuid, b.uuid);
	assert_string_equal(ss[1].uuid, a.uuid);
	assert_string_equal(ss[1].system, "Be brief.");
	store_sessions_free(ss, n);

	assert_int_equal(store_session_rename(f->s, 1, a.uuid, "Renamed", f->err), 0);
	assert_int_equal(store_session_get(f->s, 1, a.uuid, &g, f->err), 0);
	assert_string_equal(g.title, "Renamed");
	store_session_clear(&g);
	assert_int_equal(store_session_rename(f->s, 1, a.uuid, NULL, f->err), ERR_INVAL);

	assert_int_equal(store_session_delete(f->s, 1, a.uuid, f->err), 0);
	assert_int_equal(store_session_get(f->s, 1, a.uuid, &g, f->err), ERR_NOTFOUND);
	assert_null(g.title);
	assert_int_equal(store_session_delete(f->s, 1, a.uuid, f->err), ERR_NOTFOUND);
	assert_int_equal(store_session_rename(f->s, 1, a.uuid, "x", f->err), ERR_NOTFOUND);
	assert_int_equal(list_count(f, 1), 1);

	/* the data outlives the process */
	reopen(f);
	assert_int_equal(store_session_get(f->s, 1, b.uuid, &g, f->err), 0);
	store_session_clear(&g);
	store_session_clear(&a);
	store_session_clear(&b);
}

/* Appending turns and reading them back, tokens little-endian. */
static void
test_append_and_read(void **state)
{
	struct fx *f = *state;
	int32_t t0[] = { 0x01020304, -1, INT32_MAX, INT32_MIN, 0 };
	int32_t t2[] = { 7 };
	struct store_turn in[3], *out;
	char uuid[37], hex[64];
	sqlite3 *db;
	int n, i;

	new_session(f, 1, "t", uuid);
	assert_int_equal(store_turns(f->s, 1, uuid, &out, &n, f->err), 0);
	assert_int_equal(n, 0);
	assert_null(out);

	in[0] = turn("user", "Hello", t0, 5);
	in[1] = turn("assistant", "", NULL, 0);
	in[1].reasoning = (char *)"Say hello \xe2\x80\x94 back.";
	in[2] = turn("user", "again", t2, 1);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, in, 2, f->err), 0);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, in + 2, 1, f->err), 0);

	assert_int_equal(store_turns(f->s, 1, uuid, &out, &n, f->err), 0);
	assert_int_equal(n, 3);
	for (i = 0; i < 3; i++) {
		assert_string_equal(out[i].role, in[i].role);
		assert_string_equal(out[i].content, in[i].content);
		/* a turn appended without reasoning reads back as "" */
		assert_string_equal(out[i].reasoning, in[i].reasoning ? in[i].reasoning : "");
		assert_int_equal(out[i].n_tokens, in[i].n_tokens);
		if (in[i].n_tokens > 0)
			assert_memory_equal(out[i].tokens, in[i].tokens,
			    sizeof(int32_t) * (size_t)in[i].n_tokens);
		else
			assert_null(out[i].tokens);
	}
	store_turns_free(out, n);

	db = raw_open(f->path);
	assert_string_equal(raw_text(db, hex, sizeof hex, "SELECT hex(tokens) FROM turns"
	    " WHERE session = %Q AND idx = 0", uuid),
	    "04030201FFFFFFFFFFFFFF7F0000008000000000");
	assert_int_equal(raw_int(db, "SELECT group_concat(idx) = '0,1,2' FROM"
	    " (SELECT idx FROM turns WHERE session = %Q ORDER BY idx)", uuid), 1);
	/* a blob that is not whole int32s is a format error, not a crash */
	raw_exec(db, "UPDATE turns SET tokens = x'010203' WHERE session = %Q AND idx = 2", uuid);
	sqlite3_close(db);
	assert_int_equal(store_turns(f->s, 1, uuid, &out, &n, f->err), ERR_FORMAT);
	assert_int_equal(n, 0);
	assert_null(out);
}

/* n_turns, n_tokens and updated follow the appends; bad turns write nothing. */
static void
test_bookkeeping(void **state)
{
	struct fx *f = *state;
	int32_t tok[100];
	struct store_turn in[2];
	struct store_session ss;
	char uuid[37];
	sqlite3 *db;
	time_t t0;
	int i;

	for (i = 0; i < 100; i++)
		tok[i] = i;
	new_session(f, 1, "t", uuid);
	db = raw_open(f->path);
	raw_exec(db, "UPDATE sessions SET created = 1000, updated = 1000 WHERE uuid = %Q", uuid);

	in[0] = turn("user", "q", tok, 10);
	in[1] = turn("assistant", "a", tok, 90);
	t0 = time(NULL);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, in, 2, f->err), 0);
	assert_int_equal(store_session_get(f->s, 1, uuid, &ss, f->err), 0);
	assert_int_equal(ss.n_turns, 2);
	assert_int_equal(ss.n_tokens, 100);
	assert_int_equal(ss.created, 1000);
	assert_true(ss.updated >= t0);
	store_session_clear(&ss);

	raw_exec(db, "UPDATE sessions SET updated = 1000 WHERE uuid = %Q", uuid);
	/* turns generated after 1 turn, when the session has 2 by now: refused, nothing written */
	assert_int_equal(store_append_turns(f->s, 1, uuid, 1, in, 1, f->err), ERR_BUSY);
	assert_non_null(strstr(f->err, "another turn was stored meanwhile"));
	assert_int_equal(raw_int(db, "SELECT updated FROM sessions WHERE uuid = %Q", uuid), 1000);
	assert_int_equal(store_append_turns(f->s, 1, uuid, 2, in, 1, f->err), 0);
	assert_int_equal(store_session_get(f->s, 1, uuid, &ss, f->err), 0);
	assert_int_equal(ss.n_turns, 3);
	assert_int_equal(ss.n_tokens, 110);
	assert_true(ss.updated >= t0);
	store_session_clear(&ss);

	/* rename counts as an update */
	raw_exec(db, "UPDATE sessions SET updated = 1000 WHERE uuid = %Q", uuid);
	assert_int_equal(store_session_rename(f->s, 1, uuid, "r", f->err), 0);
	assert_true(raw_int(db, "SELECT updated FROM sessions WHERE uuid = %Q", uuid) >= t0);

	/* refused before anything is written */
	in[1] = turn("assistant", NULL, NULL, 0);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, in, 2, f->err), ERR_INVAL);
	in[1] = turn(NULL, "a", NULL, 0);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, in, 2, f->err), ERR_INVAL);
	in[1] = turn("assistant", "a", NULL, 3);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, in, 2, f->err), ERR_INVAL);
	in[1] = turn("assistant", "a", tok, -1);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, in, 2, f->err), ERR_INVAL);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, in, 0, f->err), ERR_INVAL);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, NULL, 1, f->err), ERR_INVAL);
	/* a session at the token limit takes no more */
	raw_exec(db, "UPDATE sessions SET n_tokens = 2147483630 WHERE uuid = %Q", uuid);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, in, 1, f->err), 0);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, in, 1, f->err), ERR_RANGE);
	raw_exec(db, "UPDATE sessions SET n_tokens = 110 WHERE uuid = %Q", uuid);

	assert_int_equal(raw_int(db, "SELECT count(*) FROM turns WHERE session = %Q", uuid), 4);
	assert_int_equal(store_session_get(f->s, 1, uuid, &ss, f->err), 0);
	assert_int_equal(ss.n_turns, 4);
	store_session_clear(&ss);
	sqlite3_close(db);
}

/* Fork copies the session and its turns; the two then live apart. */
static void
test_fork(void **state)
{
	struct fx *f = *state;
	int32_t tok[] = { 1, 2, 3 };
	struct store_turn in[2], *out;
	struct store_session p, c, c2, g;
	int n;

	assert_int_equal(store_session_new(f->s, 1, "tiny", "Plan", "sys", "{\"top_k\":5}",
	    &p, f->err), 0);
	in[0] = turn("user", "u", tok, 3);
	in[1] = turn("assistant", "a", tok, 2);
	in[1].reasoning = (char *)"r";
	assert_int_equal(store_append_turns(f->s, 1, p.uuid, -1, in, 2, f->err), 0);

	assert_int_equal(store_session_fork(f->s, 1, p.uuid, NULL, &c, f->err), 0);
	assert_string_not_equal(c.uuid, p.uuid);
	assert_string_equal(c.title, "Plan (fork)");
	assert_string_equal(c.model, "tiny");
	assert_string_equal(c.system, "sys");
	assert_string_equal(c.defaults, "{\"top_k\":5}");
	assert_int_equal(c.n_turns, 2);
	assert_int_equal(c.n_tokens, 5);
	assert_int_equal(c.uid, 1);

	assert_int_equal(store_turns(f->s, 1, c.uuid, &out, &n, f->err), 0);
	assert_int_equal(n, 2);
	assert_string_equal(out[1].role, "assistant");
	assert_string_equal(out[1].reasoning, "r");
	assert_int_equal(out[0].n_tokens, 3);
	assert_memory_equal(out[0].tokens, tok, sizeof tok);
	store_turns_free(out, n);

	/* apart: appending to the fork leaves the parent alone */
	assert_int_equal(store_append_turns(f->s, 1, c.uuid, -1, in, 1, f->err), 0);
	assert_int_equal(store_session_get(f->s, 1, p.uuid, &g, f->err), 0);
	assert_int_equal(g.n_turns, 2);
	store_session_clear(&g);
	/* and deleting the parent leaves the fork */
	assert_int_equal(store_session_delete(f->s, 1, p.uuid, f->err), 0);
	assert_int_equal(store_turns(f->s, 1, c.uuid, &out, &n, f->err), 0);
	assert_int_equal(n, 3);
	store_turns_free(out, n);

	assert_int_equal(store_session_fork(f->s, 1, c.uuid, "Named", &c2, f->err), 0);
	assert_string_equal(c2.title, "Named");
	assert_int_equal(c2.n_turns, 3);
	assert_int_equal(store_session_fork(f->s, 1, p.uuid, NULL, &g, f->err), ERR_NOTFOUND);
	assert_null(g.title);
	store_session_clear(&p);
	store_session_clear(&c);
	store_session_clear(&c2);
}

/* uid 2 cannot tell uid 1's sessions from missing ones, nor change them. */
static void
test_ownership(void **state)
{
	struct fx *f = *state;
	int32_t tok[] = { 5 };
	struct store_turn in = turn("user", "mine", tok, 1), *out;
	struct store_session ss, *list;
	char uuid[37], e_mine[ERR_LEN], e_none[ERR_LEN];
	const char *ids[2];
	sqlite3 *db;
	int n, i;

	new_session(f, 1, "secret", uuid);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, &in, 1, f->err), 0);
	ids[0] = uuid;
	ids[1] = missing_uuid;

#define BOTH(call) do {                                                   \
	char *errs[2] = { e_mine, e_none };                               \
	for (i = 0; i < 2; i++) {                                         \
		const char *id = ids[i];                                  \
		char *err = errs[i];                                      \
		assert_int_equal((call), ERR_NOTFOUND);                   \
	}                                                                 \
	assert_string_equal(e_mine, e_none);                              \
} while (0)

	BOTH(store_session_get(f->s, 2, id, &ss, err));
	assert_null(ss.title);
	BOTH(store_session_rename(f->s, 2, id, "stolen", err));
	BOTH(store_session_fork(f->s, 2, id, "stolen", &ss, err));
	BOTH(store_turns(f->s, 2, id, &out, &n, err));
	assert_int_equal(n, 0);
	BOTH(store_append_turns(f->s, 2, id, -1, &in, 1, err));
	BOTH(store_session_delete(f->s, 2, id, err));
#undef BOTH

	assert_int_equal(store_session_list(f->s, 2, 100, 0, &list, &n, f->err), 0);
	assert_int_equal(n, 0);
	assert_null(list);

	/* uid 1's session is as it was */
	assert_int_equal(store_session_get(f->s, 1, uuid, &ss, f->err), 0);
	assert_string_equal(ss.title, "secret");
	assert_int_equal(ss.n_turns, 1);
	assert_int_equal(ss.n_tokens, 1);
	store_session_clear(&ss);
	db = raw_open(f->path);
	assert_int_equal(raw_int(db, "SELECT count(*) FROM sessions"), 1);
	assert_int_equal(raw_int(db, "SELECT count(*) FROM turns"), 1);
	sqlite3_close(db);
}

/* Deleting a session deletes its turns and only its turns. */
static void
test_cascade(void **state)
{
	struct fx *f = *state;
	struct store_turn in[2] = { turn("user", "a", NULL, 0), turn("assistant", "b", NULL, 0) };
	char a[37], b[37];
	sqlite3 *db;

	new_session(f, 1, "a", a);
	new_session(f, 1, "b", b);
	assert_int_equal(store_append_turns(f->s, 1, a, -1, in, 2, f->err), 0);
	assert_int_equal(store_append_turns(f->s, 1, b, -1, in, 1, f->err), 0);
	assert_int_equal(store_session_delete(f->s, 1, a, f->err), 0);
	db = raw_open(f->path);
	assert_int_equal(raw_int(db, "SELECT count(*) FROM turns WHERE session = %Q", a), 0);
	assert_int_equal(raw_int(db, "SELECT count(*) FROM turns WHERE session = %Q", b), 1);
	assert_int_equal(raw_int(db, "SELECT count(*) FROM turns"), 1);
	sqlite3_close(db);
}

/* Checks that uid's list, from offset, is exactly the given titles. */
static void
expect_list(struct fx *f, uint32_t uid, int limit, int offset, const char *titles)
{
	struct store_session *ss;
	char got[512] = "";
	int n, i;

	assert_int_equal(store_session_list(f->s, uid, limit, offset, &ss, &n, f->err), 0);
	for (i = 0; i < n; i++) {
		if (i > 0)
			strcat(got, " ");
		strcat(got, ss[i].title);
		assert_int_equal(ss[i].uid, uid);
	}
	store_sessions_free(ss, n);
	assert_string_equal(got, titles);
}

/* Most recently updated first, within the same second too; limit, offset. */
static void
test_list_order(void **state)
{
	struct fx *f = *state;
	struct store_turn in = turn("user", "x", NULL, 0);
	struct store_session ss, *list;
	char a[37], b[37], c[37], x[37], title[16];
	int n, i;

	new_session(f, 1, "A", a);
	new_session(f, 2, "X", x);
	new_session(f, 1, "B", b);
	new_session(f, 1, "C", c);
	expect_list(f, 1, 100, 0, "C B A");
	assert_int_equal(store_append_turns(f->s, 1, a, -1, &in, 1, f->err), 0);
	expect_list(f, 1, 100, 0, "A C B");
	assert_int_equal(store_session_rename(f->s, 1, b, "B", f->err), 0);
	expect_list(f, 1, 100, 0, "B A C");
	assert_int_equal(store_session_fork(f->s, 1, c, "F", &ss, f->err), 0);
	store_session_clear(&ss);
	expect_list(f, 1, 100, 0, "F B A C");
	/* uid 2's activity does not move uid 1's sessions */
	assert_int_equal(store_append_turns(f->s, 2, x, -1, &in, 1, f->err), 0);
	expect_list(f, 1, 100, 0, "F B A C");
	expect_list(f, 2, 100, 0, "X");

	expect_list(f, 1, 2, 0, "F B");
	expect_list(f, 1, 2, 2, "A C");
	expect_list(f, 1, 2, 3, "C");
	expect_list(f, 1, 2, 4, "");
	expect_list(f, 1, 0, 0, "");
	assert_int_equal(store_session_list(f->s, 1, -1, 0, &list, &n, f->err), ERR_INVAL);
	assert_int_equal(store_session_list(f->s, 1, 1, -1, &list, &n, f->err), ERR_INVAL);

	/* more than one allocation's worth */
	for (i = 0; i < 40; i++) {
		snprintf(title, sizeof title, "s%d", i);
		new_session(f, 3, title, x);
	}
	assert_int_equal(store_session_list(f->s, 3, 1000, 0, &list, &n, f->err), 0);
	assert_int_equal(n, 40);
	for (i = 0; i < 40; i++) {
		snprintf(title, sizeof title, "s%d", 39 - i);
		assert_string_equal(list[i].title, title);
	}
	store_sessions_free(list, n);
	expect_list(f, 3, 3, 37, "s2 s1 s0");
}

/* Quotes, SQL in strings, Unicode, newlines, a long text: kept byte for byte. */
static void
test_strings(void **state)
{
	struct fx *f = *state;
	static const char title[] = "it's \"quoted\"'); DROP TABLE sessions; --";
	static const char sys[] = "日本語 🎉 naïve\n\ttab \\ backslash %s %n";
	static const char defaults[] = "{\"stop\":[\"'\",\"\\\"\",\"\\u0000\"]}";
	static const char role[] = "us'er";
	struct store_session ss, fk;
	struct store_turn in[2], *out;
	char *big;
	int n;

	big = malloc(1 << 20);
	assert_non_null(big);
	memset(big, 'x', (1 << 20) - 1);
	memcpy(big, "ü'\"", 4);
	big[(1 << 20) - 1] = '\0';

	assert_int_equal(store_session_new(f->s, 7, "m'odel \"x\"", title, sys, defaults,
	    &ss, f->err), 0);
	in[0] = turn(role, sys, NULL, 0);
	in[1] = turn("assistant", big, NULL, 0);
	assert_int_equal(store_append_turns(f->s, 7, ss.uuid, -1, in, 2, f->err), 0);
	assert_int_equal(store_session_fork(f->s, 7, ss.uuid, NULL, &fk, f->err), 0);
	assert_int_equal(strncmp(fk.title, title, strlen(title)), 0);
	assert_string_equal(fk.title + strlen(title), " (fork)");
	store_session_clear(&ss);
	assert_int_equal(store_session_get(f->s, 7, fk.uuid, &ss, f->err), 0);
	assert_string_equal(ss.model, "m'odel \"x\"");
	assert_string_equal(ss.system, sys);
	assert_string_equal(ss.defaults, defaults);
	assert_int_equal(store_turns(f->s, 7, fk.uuid, &out, &n, f->err), 0);
	assert_int_equal(n, 2);
	assert_string_equal(out[0].role, role);
	assert_string_equal(out[0].content, sys);
	assert_string_equal(out[1].content, big);
	store_turns_free(out, n);
	assert_int_equal(store_session_rename(f->s, 7, fk.uuid, sys, f->err), 0);
	store_session_clear(&ss);
	assert_int_equal(store_session_get(f->s, 7, fk.uuid, &ss, f->err), 0);
	assert_string_equal(ss.title, sys);
	assert_int_equal(list_count(f, 7), 2);
	store_session_clear(&ss);
	store_session_clear(&fk);
	free(big);
}

/* Titles and system prompts over their limits are refused; a fork's default title is cut to fit. */
static void
test_text_limits(void **state)
{
	struct fx *f = *state;
	struct store_session ss, fk;
	char *title = malloc(STORE_MAX_TITLE + 2), *sys = malloc(STORE_MAX_SYSTEM + 2);
	size_t i;

	assert_non_null(title);
	assert_non_null(sys);
	/* "a", then three-byte characters: the cut to make room for " (fork)" (249 bytes) falls inside one */
	title[0] = 'a';
	for (i = 1; i + 3 <= STORE_MAX_TITLE; i += 3)
		memcpy(title + i, "\xe4\xb8\xad", 3);
	memset(title + i, 'a', STORE_MAX_TITLE - i);
	title[STORE_MAX_TITLE] = '\0';
	memset(sys, 's', STORE_MAX_SYSTEM);
	sys[STORE_MAX_SYSTEM] = '\0';
	assert_int_equal(store_session_new(f->s, 1, "m", title, sys, NULL, &ss, f->err), 0);
	assert_int_equal(store_session_fork(f->s, 1, ss.uuid, NULL, &fk, f->err), 0);
	assert_true(strlen(fk.title) <= STORE_MAX_TITLE);
	assert_string_equal(fk.title + strlen(fk.title) - 7, " (fork)");
	assert_int_equal(strlen(fk.title) - 7, 1 + 3 * 82);
	assert_memory_equal(fk.title, title, strlen(fk.title) - 7);
	store_session_clear(&fk);

	strcat(title, "b");
	strcat(sys, "t");
	assert_int_equal(store_session_new(f->s, 1, "m", title, NULL, NULL, &fk, f->err), ERR_RANGE);
	assert_non_null(strstr(f->err, "title"));
	assert_int_equal(store_session_new(f->s, 1, "m", NULL, sys, NULL, &fk, f->err), ERR_RANGE);
	assert_non_null(strstr(f->err, "system prompt"));
	assert_int_equal(store_session_rename(f->s, 1, ss.uuid, title, f->err), ERR_RANGE);
	assert_int_equal(store_session_fork(f->s, 1, ss.uuid, title, &fk, f->err), ERR_RANGE);
	assert_null(fk.title);
	assert_int_equal(list_count(f, 1), 2);
	store_session_clear(&ss);
	free(title);
	free(sys);
}

/* The sessions-per-uid quota: new and fork refused at the limit, per uid, lifted by a delete. */
static void
test_quota(void **state)
{
	struct fx *f = *state;
	struct store_session ss[3], x;
	int i;

	store_set_max_sessions(f->s, 2);
	for (i = 0; i < 2; i++)
		assert_int_equal(store_session_new(f->s, 1, "m", "t", NULL, NULL, &ss[i], f->err), 0);
	assert_int_equal(store_session_new(f->s, 1, "m", "t", NULL, NULL, &x, f->err), ERR_QUOTA);
	assert_non_null(strstr(f->err, "2 sessions"));
	assert_int_equal(store_session_fork(f->s, 1, ss[0].uuid, NULL, &x, f->err), ERR_QUOTA);
	assert_null(x.title);
	assert_int_equal(list_count(f, 1), 2);
	/* another uid has its own count */
	assert_int_equal(store_session_new(f->s, 2, "m", "t", NULL, NULL, &ss[2], f->err), 0);
	store_session_clear(&ss[2]);
	assert_int_equal(store_session_delete(f->s, 1, ss[1].uuid, f->err), 0);
	assert_int_equal(store_session_fork(f->s, 1, ss[0].uuid, NULL, &ss[2], f->err), 0);
	store_set_max_sessions(f->s, 0);
	assert_int_equal(store_session_new(f->s, 1, "m", "t", NULL, NULL, &x, f->err), 0);
	assert_int_equal(list_count(f, 1), 3);
	store_session_clear(&x);
	for (i = 0; i < 3; i++)
		store_session_clear(&ss[i]);
}

/* The size of a file, 0 if missing. */
static off_t
file_size(const char *path)
{
	struct stat sb;

	return stat(path, &sb) == 0 ? sb.st_size : 0;
}

/*
 * A write past a file size limit (RLIMIT_FSIZE, as a full disk would) is
 * ERR_NOSPACE; the session is as it was, and the same append works once
 * the limit is lifted.
 */
static void
test_no_space(void **state)
{
	struct fx *f = *state;
	static int32_t tok[16384];
	char wal[600], *big = malloc(1 << 16);
	struct store_session ss, g;
	struct store_turn in[2], *out;
	struct rlimit old, lim;
	void (*old_sig)(int);
	int n, rc;

	assert_non_null(big);
	memset(big, 'b', (1 << 16) - 1);
	big[(1 << 16) - 1] = '\0';
	assert_int_equal(store_session_new(f->s, 1, "m", "full", NULL, NULL, &ss, f->err), 0);
	in[0] = turn("user", "kept", tok, 3);
	in[1] = turn("assistant", "also kept", tok, 2);
	assert_int_equal(store_append_turns(f->s, 1, ss.uuid, -1, in, 2, f->err), 0);

	/* room for a few more pages of WAL, not for a 64 KiB turn and its 16k tokens */
	snprintf(wal, sizeof wal, "%s-wal", f->path);
	assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
	lim = old;
	lim.rlim_cur = (rlim_t)MAX(file_size(wal), file_size(f->path)) + 8192;
	old_sig = signal(SIGXFSZ, SIG_IGN);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
	in[0] = turn("user", big, tok, 16384);
	in[1] = turn("assistant", big, tok, 16384);
	rc = store_append_turns(f->s, 1, ss.uuid, -1, in, 2, f->err);
	/* lifted before any assertion, so that a failure leaves the next tests alone */
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
	signal(SIGXFSZ, old_sig);
	assert_int_equal(rc, ERR_NOSPACE);
	assert_non_null(strstr(f->err, "no space left"));

	assert_int_equal(store_session_get(f->s, 1, ss.uuid, &g, f->err), 0);
	assert_int_equal(g.n_turns, 2);
	assert_int_equal(g.n_tokens, 5);
	store_session_clear(&g);
	assert_int_equal(store_turns(f->s, 1, ss.uuid, &out, &n, f->err), 0);
	assert_int_equal(n, 2);
	assert_string_equal(out[1].content, "also kept");
	store_turns_free(out, n);
	/* room again: the same append works */
	assert_int_equal(store_append_turns(f->s, 1, ss.uuid, -1, in, 2, f->err), 0);
	reopen(f);
	assert_int_equal(store_turns(f->s, 1, ss.uuid, &out, &n, f->err), 0);
	assert_int_equal(n, 4);
	assert_string_equal(out[3].content, big);
	store_turns_free(out, n);
	store_session_clear(&ss);
	free(big);
}

/* Malformed uuids are ERR_INVAL everywhere, before any SQL runs. */
static void
test_bad_uuids(void **state)
{
	struct fx *f = *state;
	static const char *const bad[] = {
		NULL,
		"",
		"not-a-uuid",
		"0123ABCD-0000-4000-8000-00000000beef",  /* upper case */
		"0123abcd-0000-4000-8000-00000000bee",   /* 35 */
		"0123abcd-0000-4000-8000-00000000beef0", /* 37 */
		"0123abcd0-000-4000-8000-00000000beef",  /* a dash moved */
		"0123abcd-0000-4000-8000-00000000beeg",
		"0123abcd-0000-4000-8000-00000000bee ",
		"{0123abcd-0000-4000-8000-00000000be}",
		"'; DROP TABLE sessions; --0000000000",
		"0123abcd-0000-4000-8000-00000000be\xc3\xa9",
	};
	struct store_turn in = turn("user", "x", NULL, 0), *out;
	struct store_session ss;
	char uuid[37];
	size_t i;
	int n;

	new_session(f, 1, "kept", uuid);
	for (i = 0; i < ARRAY_LEN(bad); i++) {
		arm(0, 0);
		assert_int_equal(store_session_get(f->s, 1, bad[i], &ss, f->err), ERR_INVAL);
		assert_int_equal(store_session_rename(f->s, 1, bad[i], "t", f->err), ERR_INVAL);
		assert_int_equal(store_session_fork(f->s, 1, bad[i], "t", &ss, f->err), ERR_INVAL);
		assert_int_equal(store_turns(f->s, 1, bad[i], &out, &n, f->err), ERR_INVAL);
		assert_int_equal(store_append_turns(f->s, 1, bad[i], -1, &in, 1, f->err), ERR_INVAL);
		assert_int_equal(store_session_delete(f->s, 1, bad[i], f->err), ERR_INVAL);
		assert_int_equal(step_calls, 0);
	}
	/* well-formed but not a v4 uuid: simply not found */
	assert_int_equal(store_session_get(f->s, 1, "00000000-0000-0000-0000-000000000000",
	    &ss, f->err), ERR_NOTFOUND);
	assert_int_equal(list_count(f, 1), 1);
}

/* Models: one row per path, updated in place, first-added time kept. */
static void
test_model_upsert(void **state)
{
	struct fx *f = *state;
	char buf[64];
	sqlite3 *db;

	assert_int_equal(store_model_upsert(f->s, "/m/a.gguf", "a", "h1", "llama", 100,
	    f->err), 0);
	db = raw_open(f->path);
	raw_exec(db, "UPDATE models SET added = 1");
	assert_int_equal(store_model_upsert(f->s, "/m/a.gguf", "a2", "h2", NULL, 200,
	    f->err), 0);
	assert_int_equal(store_model_upsert(f->s, "/m/b.gguf", "b", NULL, NULL, 1, f->err), 0);
	assert_int_equal(raw_int(db, "SELECT count(*) FROM models"), 2);
	assert_string_equal(raw_text(db, buf, sizeof buf,
	    "SELECT name || ' ' || hash || ' ' || size || ' ' || added || ' ' ||"
	    " ifnull(arch, 'null') FROM models WHERE path = '/m/a.gguf'"), "a2 h2 200 1 null");
	sqlite3_close(db);
	assert_int_equal(store_model_upsert(f->s, NULL, "x", NULL, NULL, 0, f->err), ERR_INVAL);
	assert_int_equal(store_model_upsert(f->s, "/x", NULL, NULL, NULL, 0, f->err), ERR_INVAL);
}

/* A version-0 database with other content is migrated in place. */
static void
test_migrate_from_zero(void **state)
{
	struct fx *f = *state;
	char path[PATH_MAX];
	struct store *s;
	sqlite3 *db;

	snprintf(path, sizeof path, "%s/old.db", f->dir);
	db = raw_open(path);
	raw_exec(db, "CREATE TABLE unrelated (x); INSERT INTO unrelated VALUES (42)");
	assert_int_equal(raw_int(db, "PRAGMA user_version"), 0);
	sqlite3_close(db);

	assert_int_equal(store_open(path, &s, f->err), 0);
	store_close(s);
	db = raw_open(path);
	assert_int_equal(raw_int(db, "PRAGMA user_version"), store_schema_version());
	assert_int_equal(raw_int(db, "SELECT x FROM unrelated"), 42);
	assert_int_equal(raw_int(db, "SELECT count(*) FROM sessions"), 0);
	sqlite3_close(db);
}

/*
 * A database that schema version 1 wrote (turns without reasoning, made
 * here from a current one) opens: its turns read back with "" for
 * reasoning, and new turns keep theirs.
 */
static void
test_migrate_reasoning(void **state)
{
	struct fx *f = *state;
	int32_t tok[] = { 4, 5 };
	struct store_turn in[2], *out;
	char uuid[37];
	sqlite3 *db;
	int n;

	new_session(f, 1, "old", uuid);
	in[0] = turn("user", "q", tok, 2);
	in[1] = turn("assistant", "<think>\nr\n</think>\n\na", tok, 1);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, in, 2, f->err), 0);
	reopen_as_version(f, 1);
	db = raw_open(f->path);
	assert_int_equal(raw_int(db, "PRAGMA user_version"), store_schema_version());
	sqlite3_close(db);
	assert_int_equal(store_turns(f->s, 1, uuid, &out, &n, f->err), 0);
	assert_int_equal(n, 2);
	assert_string_equal(out[1].content, in[1].content);
	assert_string_equal(out[1].reasoning, "");
	assert_int_equal(out[1].n_tokens, 1);
	store_turns_free(out, n);

	in[1] = turn("assistant", "b", tok, 1);
	in[1].reasoning = (char *)"why b";
	assert_int_equal(store_append_turns(f->s, 1, uuid, 2, in, 2, f->err), 0);
	assert_int_equal(store_turns(f->s, 1, uuid, &out, &n, f->err), 0);
	assert_int_equal(n, 4);
	assert_string_equal(out[3].content, "b");
	assert_string_equal(out[3].reasoning, "why b");
	store_turns_free(out, n);
}

/*
 * Tool calls and results: stored and read back, copied by a fork; a
 * database of schema version 2 (turns without them) opens, its turns read
 * back with "" for them.
 */
static void
test_tool_turns(void **state)
{
	static const char calls[] = "[{\"id\":\"call_1\",\"name\":\"f\",\"arguments\":\"{}\"}]";
	struct fx *f = *state;
	int32_t tok[] = { 4, 5 };
	struct store_turn in[3], *out;
	struct store_session fork;
	char uuid[37];
	int n;

	new_session(f, 1, "tools", uuid);
	in[0] = turn("user", "q", tok, 2);
	in[1] = turn("assistant", "", tok, 1);
	in[1].tool_calls = (char *)calls;
	in[2] = turn("tool", "42", tok, 1);
	in[2].tool_call_id = (char *)"call_1";
	in[2].tool_name = (char *)"f";
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, in, 3, f->err), 0);
	assert_int_equal(store_session_fork(f->s, 1, uuid, "fork", &fork, f->err), 0);
	assert_int_equal(store_turns(f->s, 1, fork.uuid, &out, &n, f->err), 0);
	assert_int_equal(n, 3);
	assert_string_equal(out[0].tool_calls, "");
	assert_string_equal(out[1].tool_calls, calls);
	assert_string_equal(out[1].tool_call_id, "");
	assert_string_equal(out[2].tool_call_id, "call_1");
	assert_string_equal(out[2].tool_name, "f");
	store_turns_free(out, n);
	store_session_clear(&fork);
	reopen_as_version(f, 2);
	assert_int_equal(store_turns(f->s, 1, uuid, &out, &n, f->err), 0);
	assert_int_equal(n, 3);
	assert_string_equal(out[1].tool_calls, "");
	assert_string_equal(out[2].tool_name, "");
	store_turns_free(out, n);
}

/* A migration that fails leaves nothing of itself behind. */
static void
test_migration_atomic(void **state)
{
	struct fx *f = *state;
	char path[PATH_MAX];
	struct store *s;
	sqlite3 *db;

	/* migration 1 creates sessions and turns, then fails on models */
	snprintf(path, sizeof path, "%s/clash.db", f->dir);
	db = raw_open(path);
	raw_exec(db, "CREATE TABLE models (x)");
	sqlite3_close(db);

	assert_int_equal(store_open(path, &s, f->err), ERR_IO);
	assert_null(s);
	assert_non_null(strstr(f->err, "schema version 1"));
	assert_non_null(strstr(f->err, "models"));
	db = raw_open(path);
	assert_int_equal(raw_int(db, "PRAGMA user_version"), 0);
	assert_int_equal(raw_int(db, "SELECT count(*) FROM sqlite_master WHERE name IN"
	    " ('sessions', 'turns')"), 0);
	sqlite3_close(db);
}

/* Reads a whole small file into buf; its length. */
static size_t
slurp(const char *path, char *buf, size_t cap)
{
	FILE *fp = fopen(path, "rb");
	size_t n;

	assert_non_null(fp);
	n = fread(buf, 1, cap, fp);
	fclose(fp);
	assert_true(n < cap);
	return n;
}

/* A database from a newer schema is refused and not modified. */
static void
test_future_version(void **state)
{
	struct fx *f = *state;
	static char before[1 << 16], after[1 << 16];
	char path[512], wal[PATH_MAX], buf[32];
	size_t nb, na;
	struct store *s;
	struct stat sb;
	sqlite3 *db;

	snprintf(path, sizeof path, "%s/future.db", f->dir);
	snprintf(wal, sizeof wal, "%s-wal", path);
	db = raw_open(path);
	raw_exec(db, "CREATE TABLE sessions (whatever); PRAGMA user_version = %d",
	    store_schema_version() + 1);
	sqlite3_close(db);
	nb = slurp(path, before, sizeof before);

	assert_int_equal(store_open(path, &s, f->err), ERR_UNSUPPORTED);
	assert_null(s);
	snprintf(buf, sizeof buf, "version %d", store_schema_version() + 1);
	assert_non_null(strstr(f->err, buf));
	assert_non_null(strstr(f->err, path));

	na = slurp(path, after, sizeof after);
	assert_int_equal(na, nb);
	assert_memory_equal(before, after, nb);
	assert_int_equal(stat(wal, &sb), -1);
	db = raw_open(path);
	assert_string_equal(raw_text(db, buf, sizeof buf, "PRAGMA journal_mode"), "delete");
	sqlite3_close(db);
}

/*
 * A database file the daemon may not write is refused at open, where SQLite
 * would open it read-only and every turn would fail later. Root writes any
 * file, so as root the open runs in a child as nobody, in a directory it can
 * write, on the fixture's file, which it can only read.
 */
static void
test_read_only(void **state)
{
	struct fx *f = *state;
	struct store *s = NULL;
	int rc, st;
	pid_t pid;

	store_close(f->s);
	f->s = NULL;
	assert_int_equal(chmod(f->path, 0444), 0);
	if (geteuid() != 0) {
		assert_int_equal(store_open(f->path, &s, f->err), ERR_IO);
		assert_null(s);
		assert_non_null(strstr(f->err, "read-only"));
		return;
	}
	assert_int_equal(chmod(f->dir, 0777), 0);
	assert_true((pid = fork()) >= 0);
	if (pid == 0) {
		if (setgid(65534) != 0 || setuid(65534) != 0)
			_exit(3);
		rc = store_open(f->path, &s, f->err);
		_exit(rc == ERR_IO && s == NULL && strstr(f->err, "read-only") != NULL ? 0 : 1);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

/* Every point at which an append, a fork or a create can fail rolls it back
 * whole and leaves the store usable. */
static void
test_injected_errors(void **state)
{
	struct fx *f = *state;
	int32_t tok[] = { 1, 2 };
	struct store_turn in[2] = { turn("user", "q", tok, 2), turn("assistant", "a", tok, 1) };
	struct store_session ss;
	char uuid[37];
	sqlite3 *db;
	int k, rc, failed;

	new_session(f, 1, "t", uuid);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, in, 1, f->err), 0);
	db = raw_open(f->path);

	for (k = 1, failed = 0;; k++) {
		arm(k, 0);
		rc = store_append_turns(f->s, 1, uuid, -1, in, 2, f->err);
		arm(0, 0);
		if (rc == 0)
			break;
		failed++;
		assert_int_equal(rc, ERR_IO);
		assert_non_null(strstr(f->err, "I/O error"));
		assert_int_equal(raw_int(db, "SELECT count(*) FROM turns"), 1);
		assert_int_equal(raw_int(db, "SELECT n_turns * 1000 + n_tokens FROM sessions"),
		    1002);
		/* no transaction left open: another connection can write */
		sqlite3_busy_timeout(db, 0);
		raw_exec(db, "BEGIN IMMEDIATE; ROLLBACK");
		sqlite3_busy_timeout(db, 5000);
	}
	assert_true(failed >= 6); /* begin, read, 2 inserts, update, commit */
	assert_int_equal(raw_int(db, "SELECT count(*) FROM turns"), 3);
	assert_int_equal(raw_int(db, "SELECT n_turns * 1000 + n_tokens FROM sessions"), 3005);

	for (k = 1, failed = 0;; k++) {
		arm(k, 0);
		rc = store_session_fork(f->s, 1, uuid, NULL, &ss, f->err);
		arm(0, 0);
		if (rc == 0)
			break;
		failed++;
		assert_int_equal(rc, ERR_IO);
		assert_null(ss.title);
		assert_int_equal(raw_int(db, "SELECT count(*) FROM sessions"), 1);
		assert_int_equal(raw_int(db, "SELECT count(*) FROM turns"), 3);
	}
	assert_true(failed >= 5);
	assert_int_equal(ss.n_turns, 3);
	store_session_clear(&ss);
	assert_int_equal(raw_int(db, "SELECT count(*) FROM turns"), 6);

	for (k = 1, failed = 0;; k++) {
		arm(k, 0);
		rc = store_session_new(f->s, 1, "m", "n", "s", NULL, &ss, f->err);
		arm(0, 0);
		if (rc == 0)
			break;
		failed++;
		assert_null(ss.title);
		assert_int_equal(raw_int(db, "SELECT count(*) FROM sessions"), 2);
	}
	assert_true(failed >= 4);
	store_session_clear(&ss);
	sqlite3_close(db);
}

/* The child's side of test_crash: commits one turn, then dies at step k of
 * appending two more (or after, when k is past the last step). Its own
 * failures abort, which the parent tells from both deaths it expects. */
static void
crash_child(const char *path, const char *uuid, int k, int big_n)
{
	struct store *s;
	struct store_turn in[2];
	int32_t *big = calloc((size_t)big_n, sizeof *big);
	int32_t one = 1;

	if (big == NULL || store_open(path, &s, NULL) != 0)
		abort();
	in[0] = turn("user", "committed", &one, 1);
	if (store_append_turns(s, 1, uuid, -1, in, 1, NULL) != 0)
		abort();
	in[0] = turn("user", "big", big, big_n);
	in[1] = turn("assistant", "reply", &one, 1);
	die_by_exit = k % 2;
	arm(0, k);
	if (store_append_turns(s, 1, uuid, -1, in, 2, NULL) != 0)
		abort();
	raise(SIGKILL);
	abort();
}

/*
 * kill -9 (or _exit) at every step of an append: after reopening, exactly
 * the committed turns are there, the counters agree with them, and a
 * killed transaction's pages, spilled into the WAL, are ignored.
 */
static void
test_crash(void **state)
{
	struct fx *f = *state;
	const int big_n = 1 << 20; /* 4 MiB of tokens: more than SQLite's cache */
	char uuid[37], scratch[37], wal[PATH_MAX];
	struct store_turn in[2] = { turn("user", "x", NULL, 0), turn("assistant", "y", NULL, 0) };
	struct store_turn *out;
	struct store_session ss;
	int k, steps, status, n, expect = 0, i;
	struct stat sb;
	pid_t pid;

	snprintf(wal, sizeof wal, "%s-wal", f->path);
	new_session(f, 1, "crash", uuid);
	/* how many steps an append of two turns takes */
	new_session(f, 1, "scratch", scratch);
	arm(0, 0);
	assert_int_equal(store_append_turns(f->s, 1, scratch, -1, in, 2, f->err), 0);
	steps = step_calls;
	assert_true(steps >= 6);

	for (k = 1; k <= steps + 1; k++) {
		store_close(f->s); /* no connection may cross a fork */
		f->s = NULL;
		pid = fork();
		assert_true(pid >= 0);
		if (pid == 0)
			crash_child(f->path, uuid, k, big_n);
		assert_int_equal(waitpid(pid, &status, 0), pid);
		/* (a leak checker may change the exit code: the child leaves
		 * the store open on purpose) */
		if (k % 2 && k <= steps)
			assert_true(WIFEXITED(status));
		else
			assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
		/* killed after the big insert, before COMMIT: the pages that did
		 * not fit SQLite's cache are in the WAL, uncommitted (the
		 * committed turn is a few pages) */
		if (k == steps) {
			assert_int_equal(stat(wal, &sb), 0);
			assert_true(sb.st_size > big_n);
		}

		expect += 1 + (k > steps ? 2 : 0);
		assert_int_equal(store_open(f->path, &f->s, f->err), 0);
		assert_int_equal(store_turns(f->s, 1, uuid, &out, &n, f->err), 0);
		assert_int_equal(n, expect);
		for (i = 0; i < n - (k > steps ? 2 : 0); i++)
			assert_string_equal(out[i].content, "committed");
		if (k > steps) {
			assert_string_equal(out[n - 2].content, "big");
			assert_int_equal(out[n - 2].n_tokens, big_n);
			assert_string_equal(out[n - 1].content, "reply");
		}
		store_turns_free(out, n);
		assert_int_equal(store_session_get(f->s, 1, uuid, &ss, f->err), 0);
		assert_int_equal(ss.n_turns, expect);
		assert_int_equal(ss.n_tokens, k > steps ? k + big_n + 1 : k);
		store_session_clear(&ss);
	}
}

/* Another process holding the write lock delays a write, it does not fail
 * it; reads go on meanwhile (WAL). */
static void
test_busy_wait(void **state)
{
	struct fx *f = *state;
	struct store_turn in = turn("user", "x", NULL, 0);
	struct store_session *list;
	char uuid[37], c;
	int fds[2], status, n;
	pid_t pid;

	new_session(f, 1, "busy", uuid);
	store_close(f->s); /* no connection may cross a fork */
	f->s = NULL;
	assert_int_equal(pipe(fds), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		sqlite3 *db = NULL;
		struct timespec ts = { 1, 0 };

		close(fds[0]);
		/* the parent's store_open may hold the lock a moment: wait for it, as the daemon would */
		if (sqlite3_open(f->path, &db) != SQLITE_OK || sqlite3_busy_timeout(db, 10000) != SQLITE_OK ||
		    sqlite3_exec(db, "BEGIN IMMEDIATE; INSERT INTO models VALUES"
		    " ('/p', 'n', NULL, NULL, 0, 0)", NULL, NULL, NULL) != SQLITE_OK)
			_exit(2);
		if (write(fds[1], "x", 1) != 1)
			_exit(3);
		nanosleep(&ts, NULL);
		if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
			_exit(4);
		sqlite3_close(db);
		_exit(0);
	}
	close(fds[1]);
	assert_int_equal(store_open(f->path, &f->s, f->err), 0);
	assert_int_equal(read(fds[0], &c, 1), 1);
	close(fds[0]);

	/* the child holds the write lock for a second from here: unless this
	 * process is descheduled that long, both calls below meet it */
	assert_int_equal(store_session_list(f->s, 1, 10, 0, &list, &n, f->err), 0);
	assert_int_equal(n, 1);
	store_sessions_free(list, n);
	assert_int_equal(store_append_turns(f->s, 1, uuid, -1, &in, 1, f->err), 0);

	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_open_creates, setup, teardown),
		cmocka_unit_test_setup_teardown(test_session_crud, setup, teardown),
		cmocka_unit_test_setup_teardown(test_append_and_read, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bookkeeping, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fork, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ownership, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cascade, setup, teardown),
		cmocka_unit_test_setup_teardown(test_list_order, setup, teardown),
		cmocka_unit_test_setup_teardown(test_strings, setup, teardown),
		cmocka_unit_test_setup_teardown(test_text_limits, setup, teardown),
		cmocka_unit_test_setup_teardown(test_quota, setup, teardown),
		cmocka_unit_test_setup_teardown(test_no_space, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_uuids, setup, teardown),
		cmocka_unit_test_setup_teardown(test_model_upsert, setup, teardown),
		cmocka_unit_test_setup_teardown(test_migrate_from_zero, setup, teardown),
		cmocka_unit_test_setup_teardown(test_migrate_reasoning, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tool_turns, setup, teardown),
		cmocka_unit_test_setup_teardown(test_migration_atomic, setup, teardown),
		cmocka_unit_test_setup_teardown(test_future_version, setup, teardown),
		cmocka_unit_test_setup_teardown(test_read_only, setup, teardown),
		cmocka_unit_test_setup_teardown(test_injected_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_crash, setup, teardown),
		cmocka_unit_test_setup_teardown(test_busy_wait, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
