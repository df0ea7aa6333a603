/*
 * metrics.c: GET /metrics's body, a status result (api_value_json's) in
 * Prometheus' text exposition format 0.0.4. No I/O (test_metrics).
 *
 * Each family is written whole, its # HELP and # TYPE lines and then its
 * samples (those of models one a model, labelled model="NAME"), since the
 * format wants a family's lines together. A figure the status lacks (a
 * daemon older than the bridge) has no sample. Histograms come from
 * status's {bounds, counts, sum}, whose counts are per bucket: their
 * _bucket samples add them up, to le="+Inf", which is _count.
 */
#include "config.h"
#include "openai.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum m_type { M_COUNTER, M_GAUGE, M_HISTOGRAM };

static const char *const type_name[] = { "counter", "gauge", "histogram" };

/* A sample of a labelled family: its label's value and the status figure it shows. */
struct m_part {
	const char *value, *key;
};

/*
 * A family: the status figure of its one sample ("key", or "map.key" at the
 * top level; a model's key for a model's), or, with label, a sample for
 * each part.
 */
struct m_family {
	const char *name;
	enum m_type type;
	const char *key;
	const char *help;
	const char *label;
	struct m_part parts[5];
};

static const struct m_family daemon_families[] = {
	{ "resident_uptime_seconds", M_GAUGE, "uptime_s", "Seconds since residentd started.", NULL, { { 0 } } },
	{ "resident_requests_total", M_COUNTER, NULL, "Generate requests residentd ended, by outcome: stop, length, "
	  "context (their finish), cancel (cancelled, or their client left), error (failed or refused).", "outcome",
	  { { "stop", "requests.stop" }, { "length", "requests.length" }, { "context", "requests.context" },
	    { "cancel", "requests.cancel" }, { "error", "requests.error" } } },
	{ "resident_requests_running", M_GAUGE, "active", "Generate requests admitted: generating, or their prompt "
	  "being tokenized or their KV cache loaded.", NULL, { { 0 } } },
	{ "resident_requests_queued", M_GAUGE, "queued", "Generate requests waiting to be admitted.", NULL, { { 0 } } },
	{ "resident_clients", M_GAUGE, "clients", "Connections to residentd.", NULL, { { 0 } } },
	{ "resident_steps_total", M_COUNTER, "steps.count", "Forward steps run.", NULL, { { 0 } } },
	{ "resident_step_tokens_total", M_COUNTER, "steps.tokens", "Tokens computed in forward steps, prompt and "
	  "generated.", NULL, { { 0 } } },
	{ "resident_batch_size", M_HISTOGRAM, "steps.batch", "Sequences in a forward step.", NULL, { { 0 } } },
	{ "resident_memory_budget_bytes", M_GAUGE, "memory.budget_bytes", "The device memory budget of all models.",
	  NULL, { { 0 } } },
	{ "resident_memory_used_bytes", M_GAUGE, "memory.used_bytes", "Device memory the loaded models hold.", NULL,
	  { { 0 } } },
	{ "resident_kv_bytes", M_GAUGE, NULL, "Bytes of K/V kept, by tier: the device pools, host memory, disk.",
	  "tier", { { "device", "kv.device_bytes" }, { "host", "kv.host_bytes" }, { "disk", "kv.disk_bytes" } } },
	{ "resident_kv_budget_bytes", M_GAUGE, NULL, "The budgets of the KV cache's host memory and disk tiers.",
	  "tier", { { "host", "kv.host_budget_bytes" }, { "disk", "kv.disk_budget_bytes" } } },
};

static const struct m_family model_families[] = {
	{ "resident_model_loaded", M_GAUGE, "loaded", "1 while the model is loaded.", NULL, { { 0 } } },
	{ "resident_model_memory_bytes", M_GAUGE, "memory_bytes", "The model's share of the memory budget while "
	  "loaded: weights, scratch and KV pool.", NULL, { { 0 } } },
	{ "resident_model_weights_bytes", M_GAUGE, "weights_bytes", "Bytes of the loaded model's weights.", NULL,
	  { { 0 } } },
	{ "resident_model_kv_bytes", M_GAUGE, "kv_bytes", "Bytes of the model's KV pool.", NULL, { { 0 } } },
	{ "resident_model_kv_used_bytes", M_GAUGE, "kv_used_bytes", "Bytes of K/V held or cached in the model's "
	  "pool.", NULL, { { 0 } } },
	{ "resident_model_kv_blocks", M_GAUGE, "kv_blocks", "Blocks of the model's KV pool.", NULL, { { 0 } } },
	{ "resident_model_kv_free_blocks", M_GAUGE, "kv_free_blocks", "KV blocks a request can take: free ones and "
	  "those only the prefix cache holds.", NULL, { { 0 } } },
	{ "resident_model_loads_total", M_COUNTER, "loads", "Times the model was loaded.", NULL, { { 0 } } },
	{ "resident_model_unloads_total", M_COUNTER, "unloads", "Times the model was unloaded.", NULL, { { 0 } } },
	{ "resident_model_faults_total", M_COUNTER, "faults", "Failed steps of the model's backend, each followed by "
	  "a reload.", NULL, { { 0 } } },
	{ "resident_model_requests_running", M_GAUGE, "active", "Generate requests admitted on the model.", NULL,
	  { { 0 } } },
	{ "resident_model_requests_queued", M_GAUGE, "queued", "Generate requests waiting for the model.", NULL,
	  { { 0 } } },
	{ "resident_prompt_tokens_total", M_COUNTER, "prompt_tokens", "Prompt tokens of the requests started on the "
	  "model, a session's history included.", NULL, { { 0 } } },
	{ "resident_generated_tokens_total", M_COUNTER, "generated_tokens", "Tokens the model generated.", NULL,
	  { { 0 } } },
	{ "resident_cache_hit_tokens_total", M_COUNTER, "cache_hit_tokens", "Prompt tokens found in the KV cache "
	  "since the model was loaded.", NULL, { { 0 } } },
	{ "resident_cache_host_hit_tokens_total", M_COUNTER, "cache_host_hit_tokens", "Of the prompt tokens found in "
	  "the KV cache since the model was loaded, those from host memory.", NULL, { { 0 } } },
	{ "resident_cache_disk_hit_tokens_total", M_COUNTER, "cache_disk_hit_tokens", "Of the prompt tokens found in "
	  "the KV cache since the model was loaded, those from disk.", NULL, { { 0 } } },
	{ "resident_cache_miss_tokens_total", M_COUNTER, "cache_miss_tokens", "Prompt tokens computed since the "
	  "model was loaded.", NULL, { { 0 } } },
	{ "resident_time_to_first_token_seconds", M_HISTOGRAM, "ttft", "Seconds from a request's arrival to its "
	  "first token, a wait in the queue and a load included.", NULL, { { 0 } } },
	{ "resident_inter_token_latency_seconds", M_HISTOGRAM, "itl", "Seconds between two tokens of a sequence.",
	  NULL, { { 0 } } },
};

/* The text being written; nomem once an allocation failed (the rest is not written). */
struct mtext {
	char *s;
	size_t len, cap;
	int nomem;
};

static void __attribute__((format(printf, 2, 3)))
put(struct mtext *t, const char *fmt, ...)
{
	va_list ap;
	size_t need;
	char *s;
	int n;

	if (t->nomem)
		return;
	va_start(ap, fmt);
	n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
	va_end(ap);
	if (n < 0) {
		t->nomem = 1;
		return;
	}
	if (t->s != NULL && t->len + (size_t)n < t->cap) {
		t->len += (size_t)n;
		return;
	}
	need = t->len + (size_t)n + 1;
	if ((s = realloc(t->s, need > 2 * t->cap ? need : 2 * t->cap)) == NULL) {
		t->nomem = 1;
		return;
	}
	t->s = s;
	t->cap = need > 2 * t->cap ? need : 2 * t->cap;
	va_start(ap, fmt);
	vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
	va_end(ap);
	t->len += (size_t)n;
}

/* A label's value, escaped as the format wants: backslash, double quote and newline. */
static void
put_label_value(struct mtext *t, const char *v)
{
	for (; *v != '\0'; v++) {
		if (*v == '\\' || *v == '"')
			put(t, "\\%c", *v);
		else if (*v == '\n')
			put(t, "\\n");
		else
			put(t, "%c", *v);
	}
}

/*
 * A float as the format writes it: the shortest text that reads back as v
 * (a whole number below 1e17 without an exponent: 60, not 6e+01), +Inf,
 * -Inf or NaN.
 */
static void
float_text(char *buf, size_t size, double v)
{
	int prec;

	if (isnan(v)) {
		snprintf(buf, size, "NaN");
		return;
	}
	if (isinf(v)) {
		snprintf(buf, size, "%sInf", v > 0 ? "+" : "-");
		return;
	}
	for (prec = 1; prec < 17; prec++) {
		snprintf(buf, size, "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	if (prec == 17)
		snprintf(buf, size, "%.17g", v);
	/* %g writes an exponent where the digits end before the point: a whole number */
	if (strchr(buf, 'e') != NULL && fabs(v) >= 1 && fabs(v) < 1e17)
		snprintf(buf, size, "%.0f", v);
}

/*
 * A sample's value of a figure: a number, a boolean as 1 or 0, an array as
 * its length. 0 with buf, or -1 for a figure that is none of those.
 */
static int
value_text(char *buf, size_t size, const json_t *v)
{
	if (json_is_integer(v))
		snprintf(buf, size, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
	else if (json_is_real(v))
		float_text(buf, size, json_real_value(v));
	else if (json_is_boolean(v))
		snprintf(buf, size, "%d", json_is_true(v));
	else if (json_is_array(v))
		snprintf(buf, size, "%zu", json_array_size(v));
	else
		return -1;
	return 0;
}

/* A label of a sample; a sample has at most three (model, its family's own, le). */
struct m_label {
	const char *key, *value;
};

/* One sample line: name and suffix ("_bucket", ...), the labels, the value's text. */
static void
put_sample(struct mtext *t, const char *name, const char *suffix, const struct m_label *l, int n, const char *value)
{
	int i;

	put(t, "%s%s", name, suffix);
	for (i = 0; i < n; i++) {
		put(t, "%s%s=\"", i == 0 ? "{" : ",", l[i].key);
		put_label_value(t, l[i].value);
		put(t, "\"%s", i == n - 1 ? "}" : "");
	}
	put(t, " %s\n", value);
}

/* A sample of a figure (none if the figure is absent or not a number). */
static void
put_figure(struct mtext *t, const char *name, const struct m_label *l, int n, const json_t *v)
{
	char buf[64];

	if (value_text(buf, sizeof buf, v) == 0)
		put_sample(t, name, "", l, n, buf);
}

/*
 * A histogram's samples from status's {bounds, counts, sum}: the buckets
 * cumulative, le="+Inf" and _count their total. None if it is not one.
 */
static void
put_histogram(struct mtext *t, const char *name, const struct m_label *labels, int n, const json_t *h)
{
	const json_t *bounds = json_object_get(h, "bounds"), *counts = json_object_get(h, "counts");
	const json_t *sum = json_object_get(h, "sum");
	struct m_label l[3];
	size_t i, nb = json_array_size(bounds);
	json_int_t total = 0;
	char le[64], buf[64];

	if (!json_is_array(bounds) || !json_is_array(counts) || json_array_size(counts) != nb + 1 ||
	    !json_is_number(sum) || n > 2)
		return;
	if (n > 0)
		memcpy(l, labels, (size_t)n * sizeof *l);
	l[n].key = "le";
	l[n].value = le;
	for (i = 0; i <= nb; i++) {
		total += json_integer_value(json_array_get(counts, i));
		if (i < nb)
			float_text(le, sizeof le, json_number_value(json_array_get(bounds, i)));
		else
			snprintf(le, sizeof le, "+Inf");
		snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, total);
		put_sample(t, name, "_bucket", l, n + 1, buf);
	}
	float_text(buf, sizeof buf, json_number_value(sum));
	put_sample(t, name, "_sum", labels, n, buf);
	snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, total);
	put_sample(t, name, "_count", labels, n, buf);
}

/* A family's sample (or histogram) of figure v, with labels. */
static void
put_value(struct mtext *t, const struct m_family *f, const struct m_label *l, int n, const json_t *v)
{
	if (f->type == M_HISTOGRAM)
		put_histogram(t, f->name, l, n, v);
	else
		put_figure(t, f->name, l, n, v);
}

/* A figure of the status's top level: "key" or "map.key"; NULL: absent. */
static const json_t *
top_figure(const json_t *status, const char *path)
{
	const char *dot = strchr(path, '.');
	char map[32];

	if (dot == NULL)
		return json_object_get(status, path);
	snprintf(map, sizeof map, "%.*s", (int)(dot - path), path);
	return json_object_get(json_object_get(status, map), dot + 1);
}

static void
put_family(struct mtext *t, const struct m_family *f)
{
	put(t, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name, type_name[f->type]);
}

/* A daemon-wide family: its one sample, or one a part. */
static void
put_daemon_family(struct mtext *t, const struct m_family *f, const json_t *status)
{
	struct m_label l;
	size_t i;

	put_family(t, f);
	if (f->label == NULL) {
		put_value(t, f, NULL, 0, top_figure(status, f->key));
		return;
	}
	for (i = 0; i < sizeof f->parts / sizeof f->parts[0] && f->parts[i].value != NULL; i++) {
		l.key = f->label;
		l.value = f->parts[i].value;
		put_value(t, f, &l, 1, top_figure(status, f->parts[i].key));
	}
}

/* A family of the models: a sample (or histogram) each, labelled with its name. */
static void
put_model_family(struct mtext *t, const struct m_family *f, const json_t *models)
{
	const json_t *m;
	struct m_label l;
	size_t i;

	put_family(t, f);
	json_array_foreach(models, i, m) {
		l.key = "model";
		l.value = json_string_value(json_object_get(m, "name"));
		if (l.value != NULL)
			put_value(t, f, &l, 1, json_object_get(m, f->key));
	}
}

char *
metrics_text(const json_t *status, size_t *len)
{
	const json_t *models = json_object_get(status, "models");
	struct mtext t = { NULL, 0, 0, 0 };
	size_t i;

	for (i = 0; i < sizeof daemon_families / sizeof daemon_families[0]; i++)
		put_daemon_family(&t, &daemon_families[i], status);
	for (i = 0; i < sizeof model_families / sizeof model_families[0]; i++)
		put_model_family(&t, &model_families[i], models);
	if (t.nomem) {
		free(t.s);
		return NULL;
	}
	*len = t.len;
	return t.s;
}
