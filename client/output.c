/*
 * output.c: JSON, tables and human-readable numbers for the CLI.
 */
#include "config.h"
#include "cli.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

json_t *
cli_json(const rs_value *v)
{
	json_t *j;
	size_t i;

	switch (rs_value_type(v)) {
	case RS_TYPE_BOOL: return json_boolean(rs_bool(v));
	case RS_TYPE_UINT:
		if (rs_uint(v) > (uint64_t)INT64_MAX)
			return json_real((double)rs_uint(v));
		return json_integer((json_int_t)rs_uint(v));
	case RS_TYPE_INT: return json_integer((json_int_t)rs_int(v));
	case RS_TYPE_FLOAT: return json_real(rs_float(v));
	case RS_TYPE_STR:
		j = json_stringn(rs_str(v), rs_len(v));
		return j ? j : json_null();     /* bytes that are not UTF-8 */
	case RS_TYPE_ARRAY:
		j = json_array();
		for (i = 0; i < rs_len(v); i++)
			json_array_append_new(j, cli_json(rs_at(v, i)));
		return j;
	case RS_TYPE_MAP:
		j = json_object();
		for (i = 0; i < rs_len(v); i++)
			json_object_set_new(j, rs_key(v, i), cli_json(rs_at(v, i)));
		return j;
	default:
		return json_null();
	}
}

void
cli_print_json_new(json_t *j)
{
	json_dumpf(j, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
	fputc('\n', stdout);
	fflush(stdout);
	json_decref(j);
}

void
cli_print_json(const rs_value *v)
{
	cli_print_json_new(cli_json(v));
}

const char *
cli_str(const rs_value *map, const char *key)
{
	const char *s = rs_str(rs_get(map, key));

	return s ? s : "";
}

const char *
cli_size(uint64_t bytes, char *buf)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)bytes;
	int u = 0;

	while (v >= 1024 && u < 4)
		v /= 1024, u++;
	if (u == 0)
		snprintf(buf, 32, "%llu B", (unsigned long long)bytes);
	else
		snprintf(buf, 32, "%.1f %s", v, units[u]);
	return buf;
}

const char *
cli_time(uint64_t unix_s, char *buf)
{
	time_t t = (time_t)unix_s;
	struct tm tm;

	if (unix_s == 0 || localtime_r(&t, &tm) == NULL || strftime(buf, 32, "%Y-%m-%d %H:%M", &tm) == 0)
		snprintf(buf, 32, "-");
	return buf;
}

const char *
cli_duration(double s, char *buf)
{
	unsigned long long t = s > 0 ? (unsigned long long)s : 0;

	if (t < 60)
		snprintf(buf, 32, "%.1fs", s > 0 ? s : 0);
	else if (t < 3600)
		snprintf(buf, 32, "%llum %02llus", t / 60, t % 60);
	else if (t < 86400)
		snprintf(buf, 32, "%lluh %02llum", t / 3600, t / 60 % 60);
	else
		snprintf(buf, 32, "%llud %02lluh", t / 86400, t / 3600 % 24);
	return buf;
}

size_t
cli_width(const char *s)
{
	size_t n = 0;

	for (; *s != '\0'; s++)
		n += ((unsigned char)*s & 0xc0) != 0x80;
	return n;
}

int
cli_color(void)
{
	const char *no = getenv("NO_COLOR");

	return isatty(STDOUT_FILENO) && (no == NULL || no[0] == '\0');
}

void
cli_reasoning_style(int on)
{
	static int color = -1;

	if (color < 0)
		color = cli_color();
	if (color)
		fputs(on ? "\033[2m" : "\033[0m", stdout);
}

/* ---- tables ---- */

struct table {
	int n_cols;
	char **cells;       /* rows x n_cols, the header first */
	size_t n_rows;
};

/* Appends one row of strings from a va_list. */
static void
table_vadd(struct table *t, va_list ap)
{
	const char *s;
	int i;

	t->cells = realloc(t->cells, (t->n_rows + 1) * (size_t)t->n_cols * sizeof *t->cells);
	if (t->cells == NULL) {
		fprintf(stderr, "resident: out of memory\n");
		exit(EXIT_DAEMON);
	}
	for (i = 0; i < t->n_cols; i++) {
		s = va_arg(ap, const char *);
		t->cells[t->n_rows * (size_t)t->n_cols + (size_t)i] = strdup(s ? s : "");
	}
	t->n_rows++;
}

struct table *
table_new(int n_cols, ...)
{
	struct table *t = calloc(1, sizeof *t);
	va_list ap;

	if (t == NULL) {
		fprintf(stderr, "resident: out of memory\n");
		exit(EXIT_DAEMON);
	}
	t->n_cols = n_cols;
	va_start(ap, n_cols);
	table_vadd(t, ap);
	va_end(ap);
	return t;
}

void
table_add(struct table *t, ...)
{
	va_list ap;

	va_start(ap, t);
	table_vadd(t, ap);
	va_end(ap);
}

void
table_print(struct table *t, FILE *fp)
{
	size_t *w = calloc((size_t)t->n_cols, sizeof *w), r, len;
	const char *cell;
	int i;

	for (r = 0; r < t->n_rows; r++)
		for (i = 0; i < t->n_cols; i++)
			if ((len = cli_width(t->cells[r * (size_t)t->n_cols + (size_t)i])) > w[i])
				w[i] = len;
	for (r = 0; r < t->n_rows; r++) {
		for (i = 0; i < t->n_cols; i++) {
			cell = t->cells[r * (size_t)t->n_cols + (size_t)i];
			if (i == t->n_cols - 1)
				fprintf(fp, "%s\n", cell);
			else
				fprintf(fp, "%s%*s  ", cell, (int)(w[i] - cli_width(cell)), "");
		}
	}
	fflush(fp);
	free(w);
}

void
table_free(struct table *t)
{
	size_t i;

	if (t == NULL)
		return;
	for (i = 0; i < t->n_rows * (size_t)t->n_cols; i++)
		free(t->cells[i]);
	free(t->cells);
	free(t);
}
