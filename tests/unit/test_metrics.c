/*
 * test_metrics.c: resident-http's GET /metrics text (contrib/http/metrics.c)
 * of a status result: Prometheus' text format 0.0.4, each family's HELP,
 * TYPE and samples together, label values escaped, histograms cumulative
 * to +Inf with _sum and _count, numbers written so they read back, and
 * figures a status lacks left out.
 */
#include "config.h"
#include "openai.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* A status as api_value_json has it: two models, the second with a name to escape. */
static const char *const status_json =
	"{\"version\": 1, \"uptime_s\": 0.1, \"active\": 1, \"queued\": 0,"
	" \"requests\": {\"stop\": 3, \"length\": 1, \"context\": 0, \"cancel\": 2, \"error\": 1},"
	" \"models\": ["
	"  {\"name\": \"tiny\", \"loaded\": true, \"memory_bytes\": 4096, \"loads\": 1, \"cache_hit_tokens\": 32,"
	"   \"prompt_tokens\": 40, \"generated_tokens\": 17,"
	"   \"ttft\": {\"bounds\": [0.005, 0.01, 60], \"counts\": [1, 2, 0, 3], \"sum\": 12.5},"
	"   \"itl\": {\"bounds\": [0.001], \"counts\": [0, 0], \"sum\": 0.0}},"
	"  {\"name\": \"a\\\"b\\\\c\\nd\", \"loaded\": false, \"memory_bytes\": 0,"
	"   \"ttft\": {\"bounds\": [0.005], \"counts\": [0, 1], \"sum\": 1.0}}],"
	" \"kv\": {\"device_bytes\": 8192, \"host_bytes\": 0, \"host_budget_bytes\": 4294967296,"
	"  \"disk_bytes\": 10, \"disk_budget_bytes\": 17179869184},"
	" \"memory\": {\"budget_bytes\": 1000000, \"used_bytes\": 4096, \"loads\": 1, \"unloads\": 0},"
	" \"clients\": [{\"pid\": 1}, {\"pid\": 2}],"
	" \"steps\": {\"count\": 20, \"tokens\": 57, \"max_batch\": 3, \"mean_batch\": 1.5,"
	"  \"batch\": {\"bounds\": [1, 2, 4], \"counts\": [10, 8, 2, 0], \"sum\": 30.0}}}";

/* The text of a status given as JSON text. */
static char *
text_of(const char *status)
{
	json_error_t err;
	json_t *s = json_loads(status, 0, &err);
	size_t len;
	char *text;

	if (s == NULL)
		fail_msg("bad test JSON: %s", err.text);
	text = metrics_text(s, &len);
	assert_non_null(text);
	assert_int_equal(strlen(text), len);
	json_decref(s);
	return text;
}

/* Asserts that text has the line. */
static void
has_line(const char *text, const char *line)
{
	size_t n = strlen(line);
	const char *p;

	for (p = text; (p = strstr(p, line)) != NULL; p += n)
		if ((p == text || p[-1] == '\n') && p[n] == '\n')
			return;
	fail_msg("no line '%s' in:\n%s", line, text);
}

/* Asserts that no line of text starts with prefix. */
static void
no_line(const char *text, const char *prefix)
{
	const char *p;

	for (p = text; (p = strstr(p, prefix)) != NULL; p++)
		if (p == text || p[-1] == '\n')
			fail_msg("a line starts with '%s' in:\n%s", prefix, text);
}

static void
test_families(void **state)
{
	char *text = text_of(status_json);

	has_line(text, "# HELP resident_uptime_seconds Seconds since residentd started.");
	has_line(text, "# TYPE resident_uptime_seconds gauge");
	has_line(text, "resident_uptime_seconds 0.1");
	has_line(text, "# TYPE resident_requests_total counter");
	has_line(text, "resident_requests_total{outcome=\"stop\"} 3");
	has_line(text, "resident_requests_total{outcome=\"cancel\"} 2");
	has_line(text, "resident_requests_total{outcome=\"error\"} 1");
	has_line(text, "resident_requests_running 1");
	has_line(text, "resident_clients 2");
	has_line(text, "resident_steps_total 20");
	has_line(text, "resident_kv_bytes{tier=\"device\"} 8192");
	has_line(text, "resident_kv_budget_bytes{tier=\"disk\"} 17179869184");
	has_line(text, "resident_memory_used_bytes 4096");
	has_line(text, "resident_model_loaded{model=\"tiny\"} 1");
	has_line(text, "resident_model_memory_bytes{model=\"tiny\"} 4096");
	has_line(text, "resident_prompt_tokens_total{model=\"tiny\"} 40");
	has_line(text, "resident_generated_tokens_total{model=\"tiny\"} 17");
	has_line(text, "resident_cache_hit_tokens_total{model=\"tiny\"} 32");
	has_line(text, "# TYPE resident_time_to_first_token_seconds histogram");
	free(text);
}

/* A label value's backslash, double quote and newline are escaped; the name is the model's own. */
static void
test_escaping(void **state)
{
	char *text = text_of(status_json);

	has_line(text, "resident_model_loaded{model=\"a\\\"b\\\\c\\nd\"} 0");
	has_line(text, "resident_time_to_first_token_seconds_bucket{model=\"a\\\"b\\\\c\\nd\",le=\"+Inf\"} 1");
	free(text);
}

/* Buckets add up to +Inf, which is _count; le is the bound as written; a histogram of no values is zeros. */
static void
test_histograms(void **state)
{
	char *text = text_of(status_json);

	has_line(text, "resident_time_to_first_token_seconds_bucket{model=\"tiny\",le=\"0.005\"} 1");
	has_line(text, "resident_time_to_first_token_seconds_bucket{model=\"tiny\",le=\"0.01\"} 3");
	has_line(text, "resident_time_to_first_token_seconds_bucket{model=\"tiny\",le=\"60\"} 3");
	has_line(text, "resident_time_to_first_token_seconds_bucket{model=\"tiny\",le=\"+Inf\"} 6");
	has_line(text, "resident_time_to_first_token_seconds_sum{model=\"tiny\"} 12.5");
	has_line(text, "resident_time_to_first_token_seconds_count{model=\"tiny\"} 6");
	has_line(text, "resident_inter_token_latency_seconds_bucket{model=\"tiny\",le=\"0.001\"} 0");
	has_line(text, "resident_inter_token_latency_seconds_count{model=\"tiny\"} 0");
	has_line(text, "resident_inter_token_latency_seconds_sum{model=\"tiny\"} 0");
	has_line(text, "resident_batch_size_bucket{le=\"1\"} 10");
	has_line(text, "resident_batch_size_bucket{le=\"4\"} 20");
	has_line(text, "resident_batch_size_bucket{le=\"+Inf\"} 20");
	has_line(text, "resident_batch_size_sum 30");
	has_line(text, "resident_batch_size_count 20");
	free(text);
}

/*
 * Every sample line belongs to the family of the TYPE line before it (a
 * histogram's with its suffixes), and no family is declared twice.
 */
static void
test_grouping(void **state)
{
	char *text = text_of(status_json), *line, *save = NULL, family[128] = "", seen[8192] = "|", key[132];
	size_t n;

	for (line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
		if (strncmp(line, "# TYPE ", 7) == 0) {
			n = strcspn(line + 7, " ");
			snprintf(family, sizeof family, "%.*s", (int)n, line + 7);
			snprintf(key, sizeof key, "|%s|", family);
			if (strstr(seen, key) != NULL)
				fail_msg("%s is declared twice", family);
			strcat(seen, family);
			strcat(seen, "|");
			continue;
		}
		if (line[0] == '#')
			continue;
		n = strlen(family);
		if (n == 0 || strncmp(line, family, n) != 0 ||
		    (line[n] != '{' && line[n] != ' ' && strncmp(line + n, "_bucket", 7) != 0 &&
		    strncmp(line + n, "_sum", 4) != 0 && strncmp(line + n, "_count", 6) != 0))
			fail_msg("'%s' is not of the family %s", line, family);
	}
	free(text);
}

/* A status without a figure has no sample of it, and a histogram that is none has no samples. */
static void
test_absent(void **state)
{
	char *text = text_of("{\"models\": [{\"name\": \"m\", \"ttft\": {\"bounds\": [1, 2], \"counts\": [1, 2],"
	    " \"sum\": 3}, \"itl\": [1], \"loads\": \"many\"}, {\"loaded\": true}]}");

	has_line(text, "# TYPE resident_uptime_seconds gauge");
	has_line(text, "# TYPE resident_time_to_first_token_seconds histogram");
	no_line(text, "resident_uptime_seconds ");
	no_line(text, "resident_requests_total");
	no_line(text, "resident_time_to_first_token_seconds_");
	no_line(text, "resident_inter_token_latency_seconds_");
	no_line(text, "resident_model_loads_total{");
	no_line(text, "resident_model_loaded{");
	free(text);
	text = text_of("{}");
	no_line(text, "resident_");
	free(text);
}

/* Floats read back as they were, whole ones without an exponent, and the special values are the format's. */
static void
test_numbers(void **state)
{
	char *text = text_of("{\"uptime_s\": 1e-7, \"memory\": {\"budget_bytes\": 30000000.0, \"used_bytes\": 1200.5},"
	    " \"steps\": {\"batch\": {\"bounds\": [0.1, 60, 1e300], \"counts\": [0, 0, 0, 0],"
	    " \"sum\": 0.30000000000000004}}}");

	has_line(text, "resident_uptime_seconds 1e-07");
	has_line(text, "resident_memory_budget_bytes 30000000");
	has_line(text, "resident_memory_used_bytes 1200.5");
	has_line(text, "resident_batch_size_bucket{le=\"0.1\"} 0");
	has_line(text, "resident_batch_size_bucket{le=\"60\"} 0");
	has_line(text, "resident_batch_size_bucket{le=\"1e+300\"} 0");
	has_line(text, "resident_batch_size_bucket{le=\"+Inf\"} 0");
	has_line(text, "resident_batch_size_sum 0.30000000000000004");
	free(text);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_families),
		cmocka_unit_test(test_escaping),
		cmocka_unit_test(test_histograms),
		cmocka_unit_test(test_grouping),
		cmocka_unit_test(test_absent),
		cmocka_unit_test(test_numbers),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
