/*
 * store.c: the session store in SQLite.
 *
 * Durability: the database is in WAL mode with synchronous=NORMAL. A
 * transaction is committed once its commit frame is in the WAL; that
 * survives the process being killed at any point (the frames are in the
 * kernel's cache), and recovery ignores the frames of a transaction that
 * never committed. A power loss may lose the last transactions before a
 * checkpoint, never the database's consistency.
 *
 * Invariants, kept because only store_append_turns and store_session_fork
 * write turns, each in one transaction with the session's row:
 *   - a session's turns have the indices 0 .. n_turns - 1;
 *   - its n_tokens is the sum of their token counts.
 *
 * sessions.touched orders a uid's sessions by their last update: it is one
 * more than the uid's largest on every create, append, rename and fork.
 * Listing by `updated` alone would leave sessions touched within the same
 * second in no particular order, and go wrong when the clock steps back.
 *
 * Every statement is prepared once at open and reset after each use, so
 * that none keeps a read transaction open (which would stall checkpoints).
 */
#include "config.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "util.h"

/*
 * The schema's history: entry i takes a database from version i to i + 1
 * (PRAGMA user_version), in one transaction. Append, never edit.
 */
static const char *const migrations[] = {
	/* 1: the initial schema */
	"CREATE TABLE sessions ("
	" uuid TEXT PRIMARY KEY NOT NULL,"
	" uid INTEGER NOT NULL,"
	" model TEXT NOT NULL,"
	" title TEXT NOT NULL,"
	" system TEXT NOT NULL,"
	" defaults TEXT,"              /* JSON, or NULL for none */
	" created INTEGER NOT NULL,"   /* Unix seconds */
	" updated INTEGER NOT NULL,"
	" n_tokens INTEGER NOT NULL DEFAULT 0,"
	" n_turns INTEGER NOT NULL DEFAULT 0,"
	" touched INTEGER NOT NULL"    /* per-uid update order (above) */
	");"
	"CREATE INDEX sessions_by_uid ON sessions (uid, touched);"
	"CREATE TABLE turns ("
	" session TEXT NOT NULL REFERENCES sessions (uuid) ON DELETE CASCADE,"
	" idx INTEGER NOT NULL,"
	" role TEXT NOT NULL,"
	" content TEXT NOT NULL,"
	" tokens BLOB NOT NULL,"       /* little-endian int32 token ids */
	" PRIMARY KEY (session, idx)"
	");"
	"CREATE TABLE models ("
	" path TEXT PRIMARY KEY NOT NULL,"
	" name TEXT NOT NULL,"
	" hash TEXT,"
	" arch TEXT,"
	" size INTEGER,"
	" added INTEGER NOT NULL"
	");",
	/* 2: an assistant turn's reasoning, apart from its content ("" for the turns before) */
	"ALTER TABLE turns ADD COLUMN reasoning TEXT NOT NULL DEFAULT '';",
	/* 3: an assistant turn's tool calls (JSON text), a tool result's call id and tool ('' for the turns before) */
	"ALTER TABLE turns ADD COLUMN tool_calls TEXT NOT NULL DEFAULT '';"
	"ALTER TABLE turns ADD COLUMN tool_call_id TEXT NOT NULL DEFAULT '';"
	"ALTER TABLE turns ADD COLUMN tool_name TEXT NOT NULL DEFAULT '';",
};

/* The prepared statements; those before ST_SCHEMA need no tables. */
enum store_stmt {
	ST_BEGIN_READ,
	ST_BEGIN_WRITE,
	ST_COMMIT,
	ST_ROLLBACK,
	ST_SCHEMA,
	ST_SESSION_INSERT = ST_SCHEMA,
	ST_SESSION_GET,
	ST_SESSION_COUNTS,
	ST_SESSION_COUNT_UID,
	ST_SESSION_LIST,
	ST_SESSION_RENAME,
	ST_SESSION_BUMP,
	ST_SESSION_DELETE,
	ST_TURN_INSERT,
	ST_TURNS_GET,
	ST_TURNS_COPY,
	ST_MODEL_UPSERT,
	ST_COUNT
};

#define SESSION_COLS \
	"uuid, uid, model, title, system, defaults, created, updated, n_tokens, n_turns"
/* The next value of touched for the uid bound as ?2. */
#define NEXT_TOUCH "(SELECT IFNULL(MAX(touched), 0) + 1 FROM sessions WHERE uid = ?2)"

static const char *const stmt_sql[ST_COUNT] = {
	[ST_BEGIN_READ] = "BEGIN",
	/* IMMEDIATE: take the write lock first (waiting for it), so that a
	 * transaction never fails half-way to upgrade its lock */
	[ST_BEGIN_WRITE] = "BEGIN IMMEDIATE",
	[ST_COMMIT] = "COMMIT",
	[ST_ROLLBACK] = "ROLLBACK",
	[ST_SESSION_INSERT] = "INSERT INTO sessions (uuid, uid, model, title, system,"
	    " defaults, created, updated, n_tokens, n_turns, touched)"
	    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8, ?9, " NEXT_TOUCH ")",
	[ST_SESSION_GET] = "SELECT " SESSION_COLS " FROM sessions"
	    " WHERE uuid = ?1 AND uid = ?2",
	[ST_SESSION_COUNTS] = "SELECT n_turns, n_tokens FROM sessions"
	    " WHERE uuid = ?1 AND uid = ?2",
	[ST_SESSION_COUNT_UID] = "SELECT COUNT(*) FROM sessions WHERE uid = ?1",
	[ST_SESSION_LIST] = "SELECT " SESSION_COLS " FROM sessions"
	    " WHERE uid = ?1 ORDER BY touched DESC LIMIT ?2 OFFSET ?3",
	[ST_SESSION_RENAME] = "UPDATE sessions SET title = ?3, updated = ?4,"
	    " touched = " NEXT_TOUCH " WHERE uuid = ?1 AND uid = ?2",
	[ST_SESSION_BUMP] = "UPDATE sessions SET n_turns = n_turns + ?3,"
	    " n_tokens = n_tokens + ?4, updated = ?5, touched = " NEXT_TOUCH
	    " WHERE uuid = ?1 AND uid = ?2",
	[ST_SESSION_DELETE] = "DELETE FROM sessions WHERE uuid = ?1 AND uid = ?2",
	[ST_TURN_INSERT] = "INSERT INTO turns (session, idx, role, content, tokens, reasoning, tool_calls,"
	    " tool_call_id, tool_name) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
	[ST_TURNS_GET] = "SELECT role, content, tokens, reasoning, tool_calls, tool_call_id, tool_name FROM turns"
	    " WHERE session = ?1 ORDER BY idx",
	[ST_TURNS_COPY] = "INSERT INTO turns (session, idx, role, content, tokens, reasoning, tool_calls,"
	    " tool_call_id, tool_name) SELECT ?1, idx, role, content, tokens, reasoning, tool_calls, tool_call_id,"
	    " tool_name FROM turns WHERE session = ?2",
	[ST_MODEL_UPSERT] = "INSERT INTO models (path, name, hash, arch, size, added)"
	    " VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (path) DO UPDATE SET"
	    " name = excluded.name, hash = excluded.hash, arch = excluded.arch,"
	    " size = excluded.size",
};

struct store {
	sqlite3 *db;
	sqlite3_stmt *st[ST_COUNT];
	int bind_rc;         /* the first failed bind since the last reset */
	int max_sessions;    /* per uid; 0: no limit */
	unsigned char *blob; /* scratch for encoding token ids */
	size_t blob_cap;
};

static int sql_code(int rc);
static int last_errno(struct store *s);
static int sql_err(struct store *s, int rc, const char *what, char *err);
static void bind_text(struct store *s, sqlite3_stmt *st, int i, const char *v);
static void bind_int(struct store *s, sqlite3_stmt *st, int i, int64_t v);
static void stmt_done(struct store *s, sqlite3_stmt *st);
static int stmt_step(struct store *s, sqlite3_stmt *st, const char *what, char *err);
static int tx_begin(struct store *s, int write, char *err);
static int tx_end(struct store *s, int rc, char *err);
static int not_found(char *err);
static int text_check(const char *what, const char *v, size_t max, char *err);
static int quota_check(struct store *s, uint32_t uid, char *err);
static char *fork_title(const char *parent);
static int uuid_check(const char *uuid, char *err);
static int uuid_new(char out[37], char *err);
static char *col_str(sqlite3_stmt *st, int i);
static void session_read(sqlite3_stmt *st, struct store_session *ss);
static int session_row(struct store *s, sqlite3_stmt *st, uint32_t uid, const char *uuid, char *err);
static int session_fetch(struct store *s, uint32_t uid, const char *uuid,
    struct store_session *out, char *err);
static int session_counts(struct store *s, uint32_t uid, const char *uuid,
    int32_t *n_turns, int32_t *n_tokens, char *err);
static int turns_check(const struct store_turn *t, int n, int64_t *sum, char *err);
static int turn_insert(struct store *s, const char *uuid, int32_t idx,
    const struct store_turn *t, char *err);
static int turn_read(sqlite3_stmt *st, struct store_turn *t, char *err);
static int make_parents(const char *path, char *err);
static int create_private(const char *path, char *err);
static int pragma_get(struct store *s, const char *sql, char *val, size_t len, char *err);
static int schema_check(struct store *s, int *version, char *err);
static int db_setup(struct store *s, char *err);
static int migrate_one(struct store *s, int from, char *err);
static int migrate(struct store *s, char *err);
static int stmts_prepare(struct store *s, int from, int to, char *err);

/* ---- SQLite plumbing ---- */

/* The ERR_* code for an SQLite result code. */
static int
sql_code(int rc)
{
	switch (rc & 0xff) {
	case SQLITE_NOMEM:
		return ERR_NOMEM;
	case SQLITE_CORRUPT:
	case SQLITE_NOTADB:
		return ERR_FORMAT;
	case SQLITE_TOOBIG:
		return ERR_RANGE;
	case SQLITE_CONSTRAINT:
	case SQLITE_MISMATCH:
	case SQLITE_RANGE:
		return ERR_INVAL;
	default:
		return ERR_IO;
	}
}

/*
 * The errno of the last failed write to the database's WAL or, failing
 * that, to the database file (0 if none): sqlite3_system_errno reads the
 * global errno after the fact, which later calls have overwritten.
 */
static int
last_errno(struct store *s)
{
	sqlite3_file *wal = NULL;
	int e = 0;

	if (sqlite3_file_control(s->db, "main", SQLITE_FCNTL_JOURNAL_POINTER, &wal) == SQLITE_OK && wal != NULL &&
	    wal->pMethods != NULL && wal->pMethods->xFileControl(wal, SQLITE_FCNTL_LAST_ERRNO, &e) == SQLITE_OK &&
	    errno_no_space(e))
		return e;
	if (sqlite3_file_control(s->db, "main", SQLITE_FCNTL_LAST_ERRNO, &e) != SQLITE_OK)
		e = 0;
	return e;
}

/*
 * Reports rc as "what: message" and returns its ERR_* code. A write that
 * found no room is ERR_NOSPACE, whichever way it shows: SQLite says
 * SQLITE_FULL for ENOSPC, but a plain I/O error for EFBIG (over a file
 * size limit, RLIMIT_FSIZE) or EDQUOT; the file's errno tells those apart.
 */
static int
sql_err(struct store *s, int rc, const char *what, char *err)
{
	const char *msg = sqlite3_errstr(rc);
	int e;

	/* the connection's message says more (names a table or constraint)
	 * when it is about this same error */
	if ((sqlite3_errcode(s->db) & 0xff) == (rc & 0xff))
		msg = sqlite3_errmsg(s->db);
	if ((rc & 0xff) == SQLITE_FULL)
		return err_set(err, ERR_NOSPACE, "%s: no space left for the database: %s", what, msg);
	if ((rc & 0xff) == SQLITE_IOERR && errno_no_space(e = last_errno(s)))
		return err_set(err, ERR_NOSPACE, "%s: no space left for the database: %s", what, strerror(e));
	return err_set(err, sql_code(rc), "%s: %s", what, msg);
}

/* Binds a string (NULL binds NULL); a failure is reported by stmt_step.
 * The string must outlive the statement's next reset. */
static void
bind_text(struct store *s, sqlite3_stmt *st, int i, const char *v)
{
	int rc;

	if (v == NULL)
		rc = sqlite3_bind_null(st, i);
	else
		rc = sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
	if (rc != SQLITE_OK && s->bind_rc == SQLITE_OK)
		s->bind_rc = rc;
}

/* Binds an integer; a failure is reported by stmt_step. */
static void
bind_int(struct store *s, sqlite3_stmt *st, int i, int64_t v)
{
	int rc = sqlite3_bind_int64(st, i, v);

	if (rc != SQLITE_OK && s->bind_rc == SQLITE_OK)
		s->bind_rc = rc;
}

/* Resets a statement for its next use and drops its bindings. */
static void
stmt_done(struct store *s, sqlite3_stmt *st)
{
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
	s->bind_rc = SQLITE_OK;
}

/*
 * Steps st. Returns 1 with a row to read (the caller then steps again or
 * calls stmt_done), 0 when the statement has finished, or an error; in
 * those two cases st is already reset.
 */
static int
stmt_step(struct store *s, sqlite3_stmt *st, const char *what, char *err)
{
	int rc;

	if (s->bind_rc != SQLITE_OK)
		rc = sql_err(s, s->bind_rc, what, err);
	else if ((rc = sqlite3_step(st)) == SQLITE_ROW)
		return 1;
	else if (rc == SQLITE_DONE)
		rc = 0;
	else
		rc = sql_err(s, rc, what, err);
	stmt_done(s, st);
	return rc;
}

/* Begins a transaction; a write one takes the write lock at once. */
static int
tx_begin(struct store *s, int write, char *err)
{
	return stmt_step(s, s->st[write ? ST_BEGIN_WRITE : ST_BEGIN_READ],
	    "beginning a transaction", err);
}

/*
 * Ends the transaction begun by tx_begin: commits it when rc is 0, else
 * (and when the commit fails) rolls it back. Returns rc, or the commit's
 * error.
 */
static int
tx_end(struct store *s, int rc, char *err)
{
	if (rc == 0)
		rc = stmt_step(s, s->st[ST_COMMIT], "committing", err);
	/* an I/O or memory error may have rolled back already */
	if (rc < 0 && !sqlite3_get_autocommit(s->db))
		stmt_step(s, s->st[ST_ROLLBACK], "rolling back", NULL);
	return rc;
}

/* ---- sessions ---- */

/* The one answer for a missing session and for another uid's. */
static int
not_found(char *err)
{
	return err_set(err, ERR_NOTFOUND, "session not found");
}

/* Refuses a stored text longer than max bytes. */
static int
text_check(const char *what, const char *v, size_t max, char *err)
{
	size_t n = v ? strlen(v) : 0;

	if (n > max)
		return err_set(err, ERR_RANGE, "the %s is %zu bytes; at most %zu are allowed", what, n, max);
	return 0;
}

/* Refuses a new session of uid when it holds max_sessions already. */
static int
quota_check(struct store *s, uint32_t uid, char *err)
{
	sqlite3_stmt *st = s->st[ST_SESSION_COUNT_UID];
	int64_t n;
	int rc;

	if (s->max_sessions <= 0)
		return 0;
	bind_int(s, st, 1, uid);
	if ((rc = stmt_step(s, st, "counting sessions", err)) < 0)
		return rc;
	n = rc == 1 ? sqlite3_column_int64(st, 0) : 0;
	stmt_done(s, st);
	if (n >= s->max_sessions)
		return err_set(err, ERR_QUOTA, "you have %lld sessions, the most this daemon keeps for one "
		    "user (--max-sessions); delete some first", (long long)n);
	return 0;
}

/* "parent (fork)", the parent's title cut at a character boundary to fit STORE_MAX_TITLE. */
static char *
fork_title(const char *parent)
{
	static const char suffix[] = " (fork)";
	size_t n = strlen(parent), room = STORE_MAX_TITLE - (sizeof suffix - 1);
	char *t;

	if (n > room) {
		n = room;
		while (n > 0 && ((unsigned char)parent[n] & 0xc0) == 0x80)
			n--;
	}
	t = xmalloc(n + sizeof suffix);
	memcpy(t, parent, n);
	memcpy(t + n, suffix, sizeof suffix);
	return t;
}

/* Accepts 36 characters of lowercase hex in 8-4-4-4-12 form only. */
static int
uuid_check(const char *uuid, char *err)
{
	int i;

	if (uuid == NULL || strnlen(uuid, 37) != 36)
		goto bad;
	for (i = 0; i < 36; i++) {
		char c = uuid[i];

		if (i == 8 || i == 13 || i == 18 || i == 23) {
			if (c != '-')
				goto bad;
		} else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
			goto bad;
		}
	}
	return 0;
bad:
	return err_set(err, ERR_INVAL, "malformed session uuid");
}

/* A random (version 4) uuid. */
static int
uuid_new(char out[37], char *err)
{
	static const char hex[] = "0123456789abcdef";
	unsigned char b[16];
	size_t got = 0;
	ssize_t r;
	int i, j;

	while (got < sizeof b) {
		r = getrandom(b + got, sizeof b - got, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return err_set(err, ERR_IO, "getrandom: %s", strerror(errno));
		got += (size_t)r;
	}
	b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
	b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
	for (i = 0, j = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			out[j++] = '-';
		out[j++] = hex[b[i] >> 4];
		out[j++] = hex[b[i] & 15];
	}
	out[j] = '\0';
	return 0;
}

/* A copy of a text column; "" for NULL. */
static char *
col_str(sqlite3_stmt *st, int i)
{
	const unsigned char *t = sqlite3_column_text(st, i);

	return xstrdup(t ? (const char *)t : "");
}

/* Fills ss from a row of SESSION_COLS. */
static void
session_read(sqlite3_stmt *st, struct store_session *ss)
{
	const unsigned char *u = sqlite3_column_text(st, 0);

	memset(ss, 0, sizeof *ss);
	if (u != NULL)
		memcpy(ss->uuid, u, strnlen((const char *)u, sizeof ss->uuid - 1));
	ss->uid = (uint32_t)sqlite3_column_int64(st, 1);
	ss->model = col_str(st, 2);
	ss->title = col_str(st, 3);
	ss->system = col_str(st, 4);
	if (sqlite3_column_type(st, 5) != SQLITE_NULL)
		ss->defaults = col_str(st, 5);
	ss->created = sqlite3_column_int64(st, 6);
	ss->updated = sqlite3_column_int64(st, 7);
	ss->n_tokens = sqlite3_column_int(st, 8);
	ss->n_turns = sqlite3_column_int(st, 9);
}

/*
 * Steps a statement keyed by (uuid, uid) to uid's session row. Returns 0
 * with the row ready, or the error (not found when the row is missing).
 */
static int
session_row(struct store *s, sqlite3_stmt *st, uint32_t uid, const char *uuid, char *err)
{
	int rc;

	bind_text(s, st, 1, uuid);
	bind_int(s, st, 2, uid);
	rc = stmt_step(s, st, "reading a session", err);
	if (rc == 0)
		return not_found(err);
	return rc < 0 ? rc : 0;
}

/* Reads uid's session uuid into out. */
static int
session_fetch(struct store *s, uint32_t uid, const char *uuid,
    struct store_session *out, char *err)
{
	sqlite3_stmt *st = s->st[ST_SESSION_GET];
	int rc;

	if ((rc = session_row(s, st, uid, uuid, err)) != 0)
		return rc;
	session_read(st, out);
	stmt_done(s, st);
	return 0;
}

/* Reads the counters of uid's session uuid (either pointer may be NULL). */
static int
session_counts(struct store *s, uint32_t uid, const char *uuid,
    int32_t *n_turns, int32_t *n_tokens, char *err)
{
	sqlite3_stmt *st = s->st[ST_SESSION_COUNTS];
	int rc;

	if ((rc = session_row(s, st, uid, uuid, err)) != 0)
		return rc;
	if (n_turns != NULL)
		*n_turns = sqlite3_column_int(st, 0);
	if (n_tokens != NULL)
		*n_tokens = sqlite3_column_int(st, 1);
	stmt_done(s, st);
	return 0;
}

void
store_session_clear(struct store_session *ss)
{
	if (ss == NULL)
		return;
	free(ss->model);
	free(ss->title);
	free(ss->system);
	free(ss->defaults);
	memset(ss, 0, sizeof *ss);
}

void
store_sessions_free(struct store_session *ss, int n)
{
	int i;

	for (i = 0; i < n; i++)
		store_session_clear(&ss[i]);
	free(ss);
}

void
store_turns_free(struct store_turn *t, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		free(t[i].role);
		free(t[i].content);
		free(t[i].reasoning);
		free(t[i].tool_calls);
		free(t[i].tool_call_id);
		free(t[i].tool_name);
		free(t[i].tokens);
	}
	free(t);
}

int
store_session_new(struct store *s, uint32_t uid, const char *model,
    const char *title, const char *system, const char *defaults,
    struct store_session *out, char *err)
{
	sqlite3_stmt *st = s->st[ST_SESSION_INSERT];
	char uuid[37];
	int rc;

	memset(out, 0, sizeof *out);
	if ((rc = text_check("title", title, STORE_MAX_TITLE, err)) < 0 ||
	    (rc = text_check("system prompt", system, STORE_MAX_SYSTEM, err)) < 0 ||
	    (rc = uuid_new(uuid, err)) < 0 || (rc = tx_begin(s, 1, err)) < 0)
		return rc;
	if ((rc = quota_check(s, uid, err)) < 0)
		return tx_end(s, rc, err);
	bind_text(s, st, 1, uuid);
	bind_int(s, st, 2, uid);
	bind_text(s, st, 3, model ? model : "");
	bind_text(s, st, 4, title ? title : "");
	bind_text(s, st, 5, system ? system : "");
	bind_text(s, st, 6, defaults);
	bind_int(s, st, 7, (int64_t)time(NULL));
	bind_int(s, st, 8, 0);
	bind_int(s, st, 9, 0);
	rc = stmt_step(s, st, "creating a session", err);
	if (rc == 0)
		rc = session_fetch(s, uid, uuid, out, err);
	if ((rc = tx_end(s, rc, err)) < 0)
		store_session_clear(out);
	return rc;
}

int
store_session_get(struct store *s, uint32_t uid, const char *uuid,
    struct store_session *out, char *err)
{
	int rc;

	memset(out, 0, sizeof *out);
	if ((rc = uuid_check(uuid, err)) < 0)
		return rc;
	return session_fetch(s, uid, uuid, out, err);
}

int
store_session_list(struct store *s, uint32_t uid, int limit, int offset,
    struct store_session **out, int *n, char *err)
{
	sqlite3_stmt *st = s->st[ST_SESSION_LIST];
	struct store_session *ss = NULL;
	int rc, len = 0, cap = 0;

	*out = NULL;
	*n = 0;
	if (limit < 0 || offset < 0)
		return err_set(err, ERR_INVAL, "negative limit or offset");
	if (limit == 0)
		return 0;
	bind_int(s, st, 1, uid);
	bind_int(s, st, 2, limit);
	bind_int(s, st, 3, offset);
	while ((rc = stmt_step(s, st, "listing sessions", err)) == 1) {
		if (len == cap) {
			cap = cap ? 2 * cap : 16;
			ss = xrealloc(ss, (size_t)cap * sizeof *ss);
		}
		session_read(st, &ss[len++]);
	}
	if (rc < 0) {
		store_sessions_free(ss, len);
		return rc;
	}
	*out = ss;
	*n = len;
	return 0;
}

int
store_session_rename(struct store *s, uint32_t uid, const char *uuid,
    const char *title, char *err)
{
	sqlite3_stmt *st = s->st[ST_SESSION_RENAME];
	int rc;

	if ((rc = uuid_check(uuid, err)) < 0)
		return rc;
	if (title == NULL)
		return err_set(err, ERR_INVAL, "no title");
	if ((rc = text_check("title", title, STORE_MAX_TITLE, err)) < 0)
		return rc;
	bind_text(s, st, 1, uuid);
	bind_int(s, st, 2, uid);
	bind_text(s, st, 3, title);
	bind_int(s, st, 4, (int64_t)time(NULL));
	if ((rc = stmt_step(s, st, "renaming a session", err)) < 0)
		return rc;
	return sqlite3_changes(s->db) == 0 ? not_found(err) : 0;
}

int
store_session_delete(struct store *s, uint32_t uid, const char *uuid, char *err)
{
	sqlite3_stmt *st = s->st[ST_SESSION_DELETE];
	int rc;

	if ((rc = uuid_check(uuid, err)) < 0)
		return rc;
	bind_text(s, st, 1, uuid);
	bind_int(s, st, 2, uid);
	/* the turns go with it: ON DELETE CASCADE */
	if ((rc = stmt_step(s, st, "deleting a session", err)) < 0)
		return rc;
	return sqlite3_changes(s->db) == 0 ? not_found(err) : 0;
}

int
store_session_fork(struct store *s, uint32_t uid, const char *uuid,
    const char *title, struct store_session *out, char *err)
{
	sqlite3_stmt *ins = s->st[ST_SESSION_INSERT], *copy = s->st[ST_TURNS_COPY];
	struct store_session parent;
	char child[37], *default_title = NULL;
	int rc;

	memset(out, 0, sizeof *out);
	memset(&parent, 0, sizeof parent);
	if ((rc = uuid_check(uuid, err)) < 0 || (rc = text_check("title", title, STORE_MAX_TITLE, err)) < 0 ||
	    (rc = uuid_new(child, err)) < 0 || (rc = tx_begin(s, 1, err)) < 0)
		return rc;
	rc = session_fetch(s, uid, uuid, &parent, err);
	if (rc == 0)
		rc = quota_check(s, uid, err);
	if (rc == 0) {
		if (title == NULL)
			title = default_title = fork_title(parent.title);
		bind_text(s, ins, 1, child);
		bind_int(s, ins, 2, uid);
		bind_text(s, ins, 3, parent.model);
		bind_text(s, ins, 4, title);
		bind_text(s, ins, 5, parent.system);
		bind_text(s, ins, 6, parent.defaults);
		bind_int(s, ins, 7, (int64_t)time(NULL));
		bind_int(s, ins, 8, parent.n_tokens);
		bind_int(s, ins, 9, parent.n_turns);
		rc = stmt_step(s, ins, "forking a session", err);
	}
	if (rc == 0) {
		bind_text(s, copy, 1, child);
		bind_text(s, copy, 2, uuid);
		rc = stmt_step(s, copy, "copying turns", err);
	}
	if (rc == 0)
		rc = session_fetch(s, uid, child, out, err);
	if ((rc = tx_end(s, rc, err)) < 0)
		store_session_clear(out);
	store_session_clear(&parent);
	free(default_title);
	return rc;
}

/* ---- turns ---- */

/* Checks the turns before anything is written; *sum gets their tokens. */
static int
turns_check(const struct store_turn *t, int n, int64_t *sum, char *err)
{
	int i;

	*sum = 0;
	if (t == NULL || n < 1)
		return err_set(err, ERR_INVAL, "no turns to append");
	for (i = 0; i < n; i++) {
		if (t[i].role == NULL || t[i].content == NULL)
			return err_set(err, ERR_INVAL, "turn %d has no role or content", i);
		if (t[i].n_tokens < 0 || (t[i].n_tokens > 0 && t[i].tokens == NULL))
			return err_set(err, ERR_INVAL, "turn %d has no tokens", i);
		if (t[i].n_tokens > INT32_MAX / 4)
			return err_set(err, ERR_RANGE, "turn %d has too many tokens", i);
		*sum += t[i].n_tokens;
	}
	return 0;
}

/* Writes one turn at index idx, its token ids little-endian. */
static int
turn_insert(struct store *s, const char *uuid, int32_t idx,
    const struct store_turn *t, char *err)
{
	sqlite3_stmt *st = s->st[ST_TURN_INSERT];
	size_t need = (size_t)t->n_tokens * 4;
	unsigned char *b;
	int32_t i;
	int rc;

	if (need > s->blob_cap) {
		s->blob = xrealloc(s->blob, need);
		s->blob_cap = need;
	}
	for (i = 0, b = s->blob; i < t->n_tokens; i++, b += 4) {
		uint32_t v = (uint32_t)t->tokens[i];

		b[0] = (unsigned char)v;
		b[1] = (unsigned char)(v >> 8);
		b[2] = (unsigned char)(v >> 16);
		b[3] = (unsigned char)(v >> 24);
	}
	bind_text(s, st, 1, uuid);
	bind_int(s, st, 2, idx);
	bind_text(s, st, 3, t->role);
	bind_text(s, st, 4, t->content);
	bind_text(s, st, 6, t->reasoning ? t->reasoning : "");
	bind_text(s, st, 7, t->tool_calls ? t->tool_calls : "");
	bind_text(s, st, 8, t->tool_call_id ? t->tool_call_id : "");
	bind_text(s, st, 9, t->tool_name ? t->tool_name : "");
	/* a zero-length blob, never NULL, for a turn without tokens */
	rc = need ? sqlite3_bind_blob(st, 5, s->blob, (int)need, SQLITE_STATIC)
	    : sqlite3_bind_zeroblob(st, 5, 0);
	if (rc != SQLITE_OK && s->bind_rc == SQLITE_OK)
		s->bind_rc = rc;
	return stmt_step(s, st, "appending a turn", err);
}

/* Copies the current row of ST_TURNS_GET into t. */
static int
turn_read(sqlite3_stmt *st, struct store_turn *t, char *err)
{
	const unsigned char *b;
	int bytes, i;

	memset(t, 0, sizeof *t);
	b = sqlite3_column_blob(st, 2);
	bytes = sqlite3_column_bytes(st, 2);
	if (bytes % 4 != 0)
		return err_set(err, ERR_FORMAT, "a turn's token blob has %d bytes", bytes);
	if (bytes > 0 && b == NULL)
		return err_set(err, ERR_NOMEM, "reading a turn's tokens: out of memory");
	t->role = col_str(st, 0);
	t->content = col_str(st, 1);
	t->reasoning = col_str(st, 3);
	t->tool_calls = col_str(st, 4);
	t->tool_call_id = col_str(st, 5);
	t->tool_name = col_str(st, 6);
	t->n_tokens = bytes / 4;
	if (t->n_tokens > 0)
		t->tokens = xmalloc((size_t)bytes);
	for (i = 0; i < t->n_tokens; i++, b += 4)
		t->tokens[i] = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 |
		    (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
	return 0;
}

int
store_turns(struct store *s, uint32_t uid, const char *uuid,
    struct store_turn **out, int *n, char *err)
{
	sqlite3_stmt *st = s->st[ST_TURNS_GET];
	struct store_turn *t = NULL;
	int rc, len = 0, cap = 0;

	*out = NULL;
	*n = 0;
	if ((rc = uuid_check(uuid, err)) < 0 || (rc = tx_begin(s, 0, err)) < 0)
		return rc;
	rc = session_counts(s, uid, uuid, NULL, NULL, err);
	if (rc == 0) {
		bind_text(s, st, 1, uuid);
		while ((rc = stmt_step(s, st, "reading turns", err)) == 1) {
			if (len == cap) {
				cap = cap ? 2 * cap : 16;
				t = xrealloc(t, (size_t)cap * sizeof *t);
			}
			if ((rc = turn_read(st, &t[len], err)) < 0) {
				stmt_done(s, st);
				break;
			}
			len++;
		}
	}
	if ((rc = tx_end(s, rc, err)) < 0) {
		store_turns_free(t, len);
		return rc;
	}
	*out = t;
	*n = len;
	return 0;
}

int
store_append_turns(struct store *s, uint32_t uid, const char *uuid, int32_t after,
    const struct store_turn *t, int n, char *err)
{
	sqlite3_stmt *bump = s->st[ST_SESSION_BUMP];
	int32_t n_turns, n_tokens;
	int64_t sum;
	int rc, i;

	if ((rc = uuid_check(uuid, err)) < 0 || (rc = turns_check(t, n, &sum, err)) < 0 ||
	    (rc = tx_begin(s, 1, err)) < 0)
		return rc;
	rc = session_counts(s, uid, uuid, &n_turns, &n_tokens, err);
	if (rc == 0 && after >= 0 && n_turns != after)
		rc = err_set(err, ERR_BUSY, "the session has %d turns, not the %d this turn was generated after: "
		    "another turn was stored meanwhile", (int)n_turns, (int)after);
	if (rc == 0 && ((int64_t)n_turns + n > INT32_MAX || n_tokens + sum > INT32_MAX))
		rc = err_set(err, ERR_RANGE, "the session would exceed 2^31 turns or tokens");
	for (i = 0; rc == 0 && i < n; i++)
		rc = turn_insert(s, uuid, n_turns + i, &t[i], err);
	if (rc == 0) {
		bind_text(s, bump, 1, uuid);
		bind_int(s, bump, 2, uid);
		bind_int(s, bump, 3, n);
		bind_int(s, bump, 4, sum);
		bind_int(s, bump, 5, (int64_t)time(NULL));
		rc = stmt_step(s, bump, "updating a session", err);
	}
	return tx_end(s, rc, err);
}

/* ---- models ---- */

int
store_model_upsert(struct store *s, const char *path, const char *name,
    const char *hash, const char *arch, int64_t size, char *err)
{
	sqlite3_stmt *st = s->st[ST_MODEL_UPSERT];

	if (path == NULL || name == NULL)
		return err_set(err, ERR_INVAL, "a model needs a path and a name");
	bind_text(s, st, 1, path);
	bind_text(s, st, 2, name);
	bind_text(s, st, 3, hash);
	bind_text(s, st, 4, arch);
	bind_int(s, st, 5, size);
	bind_int(s, st, 6, (int64_t)time(NULL));
	return stmt_step(s, st, "recording a model", err);
}

/* ---- opening, migrations ---- */

int
store_schema_version(void)
{
	return (int)ARRAY_LEN(migrations);
}

void
store_set_max_sessions(struct store *s, int n)
{
	s->max_sessions = n;
}

/* Creates the missing directories above path, mode 0700. */
static int
make_parents(const char *path, char *err)
{
	char *p = xstrdup(path), *q;
	struct stat sb;
	int rc = 0;

	for (q = p + 1; (q = strchr(q, '/')) != NULL; q++) {
		*q = '\0';
		if (mkdir(p, 0700) < 0 && errno != EEXIST &&
		    (stat(p, &sb) < 0 || !S_ISDIR(sb.st_mode))) {
			rc = err_set(err, ERR_IO, "creating %s: %s", p, strerror(errno));
			break;
		}
		*q = '/';
	}
	free(p);
	return rc;
}

/* Creates the database file 0600 if it is missing (SQLite would make it
 * 0644; its -wal and -shm files take the database's mode). */
static int
create_private(const char *path, char *err)
{
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);

	if (fd >= 0)
		close(fd);
	else if (errno != EEXIST)
		return err_set(err, ERR_IO, "creating %s: %s", path, strerror(errno));
	return 0;
}

/* Runs a PRAGMA and copies its first value as text ("" when no row). */
static int
pragma_get(struct store *s, const char *sql, char *val, size_t len, char *err)
{
	sqlite3_stmt *st;
	const unsigned char *t;
	int rc;

	if ((rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL)) != SQLITE_OK)
		return sql_err(s, rc, sql, err);
	val[0] = '\0';
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		t = sqlite3_column_text(st, 0);
		snprintf(val, len, "%s", t ? (const char *)t : "");
		rc = 0;
	} else if (rc == SQLITE_DONE) {
		rc = 0;
	} else {
		rc = sql_err(s, rc, sql, err);
	}
	sqlite3_finalize(st);
	return rc;
}

/* Reads the schema version, refusing one newer than this code's. */
static int
schema_check(struct store *s, int *version, char *err)
{
	char v[32];
	int rc;

	if ((rc = pragma_get(s, "PRAGMA user_version", v, sizeof v, err)) < 0)
		return rc;
	*version = atoi(v);
	if (*version < 0 || *version > store_schema_version())
		return err_set(err, ERR_UNSUPPORTED, "schema version %d is newer than "
		    "this residentd knows (%d); leaving the database alone",
		    *version, store_schema_version());
	return 0;
}

/* Sets the connection up: busy wait, WAL, synchronous, foreign keys. */
static int
db_setup(struct store *s, char *err)
{
	char v[32];
	int rc, version;

	sqlite3_busy_timeout(s->db, STORE_BUSY_MS);
	/* before anything that writes: a newer database is not ours to touch */
	if ((rc = schema_check(s, &version, err)) < 0)
		return rc;
	if ((rc = pragma_get(s, "PRAGMA journal_mode = WAL", v, sizeof v, err)) < 0)
		return rc;
	if (strcmp(v, "wal") != 0)
		return err_set(err, ERR_UNSUPPORTED,
		    "cannot use WAL journal mode (got \"%s\")", v);
	/* the WAL file is trimmed back to 64 MiB after a checkpoint */
	rc = sqlite3_exec(s->db, "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;"
	    " PRAGMA journal_size_limit = 67108864",
	    NULL, NULL, NULL);
	if (rc != SQLITE_OK)
		return sql_err(s, rc, "setting pragmas", err);
	if ((rc = pragma_get(s, "PRAGMA foreign_keys", v, sizeof v, err)) < 0)
		return rc;
	if (strcmp(v, "1") != 0)
		return err_set(err, ERR_UNSUPPORTED, "SQLite without foreign keys");
	return 0;
}

/* Applies migration from + 1 inside the caller's transaction. */
static int
migrate_one(struct store *s, int from, char *err)
{
	char sql[64], what[64];
	int rc;

	snprintf(what, sizeof what, "migrating to schema version %d", from + 1);
	rc = sqlite3_exec(s->db, migrations[from], NULL, NULL, NULL);
	if (rc == SQLITE_OK) {
		snprintf(sql, sizeof sql, "PRAGMA user_version = %d", from + 1);
		rc = sqlite3_exec(s->db, sql, NULL, NULL, NULL);
	}
	return rc == SQLITE_OK ? 0 : sql_err(s, rc, what, err);
}

/*
 * Brings the schema up to date, one migration per transaction. The version
 * is read again under the write lock: another process may have migrated
 * while this one waited.
 */
static int
migrate(struct store *s, char *err)
{
	int rc, version;

	if ((rc = schema_check(s, &version, err)) < 0)
		return rc;
	while (version < store_schema_version()) {
		if ((rc = tx_begin(s, 1, err)) < 0)
			return rc;
		rc = schema_check(s, &version, err);
		if (rc == 0 && version < store_schema_version())
			rc = migrate_one(s, version++, err);
		if ((rc = tx_end(s, rc, err)) < 0)
			return rc;
	}
	return 0;
}

/* Prepares statements [from, to) to be kept until close. */
static int
stmts_prepare(struct store *s, int from, int to, char *err)
{
	int i, rc;

	for (i = from; i < to; i++) {
		rc = sqlite3_prepare_v3(s->db, stmt_sql[i], -1,
		    SQLITE_PREPARE_PERSISTENT, &s->st[i], NULL);
		if (rc != SQLITE_OK)
			return sql_err(s, rc, "preparing statements", err);
	}
	return 0;
}

int
store_open(const char *path, struct store **out, char *err)
{
	struct store *s;
	int rc;

	*out = NULL;
	if (path == NULL || *path == '\0')
		return err_set(err, ERR_INVAL, "no database path");
	if ((rc = make_parents(path, err)) < 0 || (rc = create_private(path, err)) < 0)
		return rc;
	s = xcalloc(1, sizeof *s);
	s->max_sessions = STORE_MAX_SESSIONS_DEFAULT;
	rc = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
	if (rc != SQLITE_OK) {
		if (s->db == NULL)
			rc = err_set(err, ERR_NOMEM, "out of memory");
		else
			rc = sql_err(s, rc, "opening", err);
	} else if (sqlite3_db_readonly(s->db, "main") == 1) {
		/* SQLite opens a file it may not write read-only, and every turn would fail later */
		rc = err_set(err, ERR_IO, "the database is read-only (its file's permissions): residentd must write it");
	} else if ((rc = db_setup(s, err)) == 0 &&
	    (rc = stmts_prepare(s, 0, ST_SCHEMA, err)) == 0 &&
	    (rc = migrate(s, err)) == 0) {
		rc = stmts_prepare(s, ST_SCHEMA, ST_COUNT, err);
	}
	if (rc < 0) {
		store_close(s);
		return err_prefix(err, rc, "%s", path);
	}
	*out = s;
	return 0;
}

void
store_close(struct store *s)
{
	int i;

	if (s == NULL)
		return;
	for (i = 0; i < ST_COUNT; i++)
		sqlite3_finalize(s->st[i]);
	sqlite3_close(s->db);
	free(s->blob);
	free(s);
}
