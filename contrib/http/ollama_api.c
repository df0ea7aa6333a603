/*
 * ollama_api.c: Ollama's JSON (its /api/ routes, as Ollama's docs/api.md
 * and its Python client's types have them) on one side, resident's on the
 * other. A request of /api/chat or /api/generate becomes the api_req that
 * OpenAI's requests become (api.c and tools.c parse the parts the two APIs
 * share: messages, tools, stop, logprobs), so that call.c runs both alike;
 * what differs is here: options, format, think, keep_alive, model names,
 * the replies' objects and those of the model routes. No I/O.
 *
 * Model names. Ollama's are "name:tag", the tag "latest" when a client
 * gives none; resident's are a file's base name (gemma-3-270m-q4_k_m). A
 * name resolves to the daemon's model of that exact name, else, when it
 * ends in ":latest", to the one named without it. /api/tags lists each
 * model as "NAME:latest" (a name with a ':' of its own as it is), so that
 * a name a client picks from the list comes back resolved.
 */
#include "config.h"
#include "openai.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define LATEST ":latest"

/*
 * Ollama's options that are resident's sampling fields. A num_predict of
 * 0 or less (Ollama's -1: no limit, -2: fill the context) and a negative
 * seed (random) are taken out before: the daemon's max_tokens default
 * (512) and a seed drawn here stand for them.
 */
static const struct api_num_field option_fields[] = {
	{ "num_predict", "max_tokens", API_NUM_POSITIVE },
	{ "temperature", "temperature", API_NUM_FLOAT },
	{ "top_k", "top_k", API_NUM_UINT },
	{ "top_p", "top_p", API_NUM_FLOAT },
	{ "min_p", "min_p", API_NUM_FLOAT },
	{ "seed", "seed", API_NUM_UINT },
	{ "repeat_penalty", "repeat_penalty", API_NUM_FLOAT },
	{ "presence_penalty", "presence_penalty", API_NUM_FLOAT },
	{ "frequency_penalty", "frequency_penalty", API_NUM_FLOAT },
};

/*
 * Sampling options of Ollama's that resident's sampler has no step for:
 * refused unless at the value that leaves sampling as it is (clients send
 * whole option sets at their defaults). The other options (num_ctx,
 * num_gpu, num_thread and the rest of how Ollama runs a model; num_keep,
 * repeat_last_n, penalize_newline) are ignored: residentd's own settings
 * decide those.
 */
static const struct {
	const char *name;
	double neutral;
} options_refused[] = {
	{ "typical_p", 1 }, { "mirostat", 0 }, { "tfs_z", 1 },
};

/* Go's duration units (time.ParseDuration), longer spellings before their prefixes. */
static const struct {
	const char *unit;
	double seconds;
} duration_units[] = {
	{ "ns", 1e-9 }, { "us", 1e-6 }, { "\xc2\xb5s", 1e-6 }, { "\xce\xbcs", 1e-6 }, { "ms", 1e-3 },
	{ "s", 1 }, { "m", 60 }, { "h", 3600 },
};

#define COUNT(a) (sizeof (a) / sizeof (a)[0])

double
ollama_now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* A string member's value, "" when it is not one. */
static const char *
str(const json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));

	return s ? s : "";
}

/* ---- requests ---- */

int
ollama_keep_alive(const json_t *v, double *seconds, struct api_error *e)
{
	const char *s, *p;
	char *end;
	double total = 0, x;
	size_t i, n = 0;
	int neg;

	if (json_is_number(v)) {
		*seconds = json_number_value(v);
		goto out;
	}
	if ((s = json_string_value(v)) == NULL)
		goto bad;
	x = strtod(s, &end);
	if (end != s && *end == '\0') {
		*seconds = x;            /* a number as text: seconds, as a number is */
	} else {
		/* Go's [-+]?([0-9]*(\.[0-9]*)?unit)+ */
		p = s + (s[0] == '-' || s[0] == '+');
		neg = s[0] == '-';
		if (*p == '\0')
			goto bad;
		for (; *p != '\0'; p = end + n) {
			if (!isdigit((unsigned char)*p) && *p != '.')
				goto bad;
			x = strtod(p, &end);
			for (i = 0; end != p && i < COUNT(duration_units); i++)
				if (strncmp(end, duration_units[i].unit, n = strlen(duration_units[i].unit)) == 0)
					break;
			if (end == p || i == COUNT(duration_units))
				goto bad;
			total += x * duration_units[i].seconds;
		}
		*seconds = neg ? -total : total;
	}
out:
	if (!isfinite(*seconds))
		goto bad;
	if (*seconds < 0)
		*seconds = -1;
	return 0;
bad:
	return api_bad(e, "keep_alive", "keep_alive must be a number of seconds or a duration such as \"30s\", "
	    "\"5m\" or \"1h30m\" (negative: the model stays loaded until its memory is needed)");
}

/* model: required; kept as asked (replies echo it) and as the daemon's name, until call.c resolves it. */
static int
parse_model(const json_t *o, struct api_req *r, struct api_error *e)
{
	json_t *m = api_field(o, "model");

	if (!json_is_string(m) || json_string_length(m) == 0)
		return api_bad(e, "model", "model is required: one of the names of GET /api/tags");
	if ((r->asked = strdup(json_string_value(m))) == NULL || (r->model = strdup(r->asked)) == NULL)
		return api_nomem(e);
	return 0;
}

/* stream: true unless false (Ollama's default is to stream). */
static int
parse_stream(const json_t *o, struct api_req *r, struct api_error *e)
{
	json_t *v = api_field(o, "stream");

	if (v != NULL && !json_is_boolean(v))
		return api_bad(e, "stream", "stream must be a boolean");
	r->stream = v == NULL || json_is_true(v);
	return 0;
}

/* images: base64 pictures for vision models; resident's models take text alone. where: "" or a message's. */
static int
refuse_images(const json_t *o, const char *where, struct api_error *e)
{
	json_t *v = api_field(o, "images");

	if (v == NULL || (json_is_array(v) && json_array_size(v) == 0))
		return 0;
	return api_bad(e, "images", "%simages are not supported: resident's models read text alone", where);
}

/* messages (none: a load); images refused; tools and resident's tool_choice as OpenAI's. */
static int
parse_chat(const json_t *o, struct api_req *r, int *empty, struct api_error *e)
{
	json_t *a = api_field(o, "messages"), *m;
	char where[48];
	size_t i;

	if (a == NULL || (json_is_array(a) && json_array_size(a) == 0)) {
		*empty = 1;
		return 0;
	}
	json_array_foreach(a, i, m) {
		snprintf(where, sizeof where, "messages[%zu]: ", i);
		if (refuse_images(m, where, e) != 0)
			return -1;
	}
	r->kind = API_CHAT;
	return api_parse_messages(o, r, e) != 0 || api_tools_parse(o, r, e) != 0 ? -1 : 0;
}

/* A string field, absent or null: NULL; another type: -1 with *e. */
static int
string_field(const json_t *o, const char *key, const char **out, struct api_error *e)
{
	json_t *v = api_field(o, key);

	if (v != NULL && !json_is_string(v))
		return api_bad(e, key, "%s must be a string", key);
	*out = json_string_value(v);
	return 0;
}

/* Appends a message of role and content to r's. */
static int
add_message(struct api_req *r, const char *role, const char *content, struct api_error *e)
{
	struct api_msg *m = &r->msgs[r->n_msgs];

	m->role = role;
	if ((m->content = strdup(content)) == NULL)
		return api_nomem(e);
	r->n_msgs++;
	return 0;
}

/*
 * prompt (none or "": a load), through the model's template as a user
 * message after the system one, or with raw true as it is.
 */
static int
parse_generate(const json_t *o, struct api_req *r, int *empty, struct api_error *e)
{
	const char *prompt, *system, *suffix, *template;
	json_t *raw = api_field(o, "raw"), *context = api_field(o, "context");

	if (string_field(o, "prompt", &prompt, e) != 0 || string_field(o, "system", &system, e) != 0 ||
	    string_field(o, "suffix", &suffix, e) != 0 || string_field(o, "template", &template, e) != 0 ||
	    refuse_images(o, "", e) != 0)
		return -1;
	if (raw != NULL && !json_is_boolean(raw))
		return api_bad(e, "raw", "raw must be a boolean");
	if (suffix != NULL && suffix[0] != '\0')
		return api_bad(e, "suffix", "suffix is not supported: resident does not fill in the middle");
	if (template != NULL && template[0] != '\0')
		return api_bad(e, "template", "template is not supported: resident renders prompts with the model's "
		    "own chat template (raw: true sends the prompt as it is)");
	if (context != NULL && !(json_is_array(context) && json_array_size(context) == 0))
		return api_bad(e, "context", "context is not supported: resident-http returns none; /api/chat "
		    "takes the conversation's messages");
	if (prompt == NULL || prompt[0] == '\0') {
		*empty = 1;
		return 0;
	}
	if (json_is_true(raw)) {
		if (system != NULL && system[0] != '\0')
			return api_bad(e, "system", "raw mode does not support system: the prompt is sent as it is");
		r->kind = API_COMPLETION;
		return (r->prompt = strdup(prompt)) == NULL ? api_nomem(e) : 0;
	}
	r->kind = API_CHAT;
	if ((r->msgs = calloc(2, sizeof *r->msgs)) == NULL)
		return api_nomem(e);
	if (system != NULL && system[0] != '\0' && add_message(r, "system", system, e) != 0)
		return -1;
	return add_message(r, "user", prompt, e);
}

/*
 * think: true, false or a level, the daemon's think ("max" its "high").
 * false also leaves the reasoning out of the replies: gpt-oss reasons at
 * its lowest effort all the same.
 */
static int
parse_think(const json_t *o, struct api_req *r, struct api_error *e)
{
	static const char *const levels[][2] = { { "low", "low" }, { "medium", "medium" }, { "high", "high" },
		{ "max", "high" } };
	json_t *v = api_field(o, "think");

	if (v == NULL || json_is_true(v))
		return 0;
	if (json_is_false(v)) {
		r->hide_reasoning = 1;
		r->think = "off";
		return 0;
	}
	if ((r->think = api_think(v, levels, COUNT(levels))) != NULL)
		return 0;
	return api_bad(e, "think", "think must be true, false, \"low\", \"medium\", \"high\" or \"max\"");
}

/* format: "json" (one JSON object) or a JSON Schema, the daemon's json and json_schema; "": none. */
static int
parse_format(const json_t *o, struct api_req *r, struct api_error *e)
{
	json_t *f = api_field(o, "format");

	if (f == NULL || (json_is_string(f) && json_string_length(f) == 0))
		return 0;
	if (json_is_string(f) && strcmp(json_string_value(f), "json") == 0) {
		r->constraint = "json";
		return 0;
	}
	if (!json_is_object(f))
		return api_bad(e, "format", "format must be \"json\" or a JSON Schema (an object)");
	r->constraint = "json_schema";
	if ((r->constraint_text = json_dumps(f, JSON_COMPACT)) == NULL)
		return api_nomem(e);
	return 0;
}

static int
parse_options(const json_t *o, struct api_req *r, struct api_error *e)
{
	json_t *opts = api_field(o, "options"), *v, *copy;
	size_t i;
	int rc;

	if (opts == NULL)
		return 0;
	if (!json_is_object(opts))
		return api_bad(e, "options", "options must be an object");
	for (i = 0; i < COUNT(options_refused); i++) {
		v = api_field(opts, options_refused[i].name);
		if (v != NULL && (!json_is_number(v) || json_number_value(v) != options_refused[i].neutral))
			return api_bad(e, "options", "options.%s is not supported: resident's sampling has no such step "
			    "(only %g, which changes nothing, is taken)", options_refused[i].name, options_refused[i].neutral);
	}
	if ((copy = json_copy(opts)) == NULL)
		return api_nomem(e);
	v = json_object_get(copy, "num_predict");
	if (json_is_integer(v) && json_integer_value(v) <= 0)
		json_object_del(copy, "num_predict");
	v = json_object_get(copy, "seed");
	if (json_is_integer(v) && json_integer_value(v) < 0)
		json_object_del(copy, "seed");
	rc = api_parse_nums(copy, option_fields, COUNT(option_fields), r, e) != 0 ||
	    api_parse_stop(copy, r, e) != 0 ? -1 : 0;
	json_decref(copy);
	return rc;
}

/* Adds a numeric generate field, unless the request set it already. */
static void
add_num(struct api_req *r, const char *key, int is_uint, uint64_t u, double f)
{
	for (int i = 0; i < r->n_nums; i++)
		if (strcmp(r->nums[i].key, key) == 0)
			return;
	if (r->n_nums < API_MAX_NUMS)
		r->nums[r->n_nums++] = (struct api_num){ key, is_uint, u, f };
}

/* A seed of its own for a request that gives none, as Ollama draws one: a reply asked for again differs. */
static uint64_t
random_seed(void)
{
	uint32_t s;

	if (getrandom(&s, sizeof s, GRND_NONBLOCK) != (ssize_t)sizeof s)
		s = (uint32_t)(ollama_now() * 1e6);
	return s;
}

int
ollama_parse(enum api_dialect d, const char *body, size_t len, struct api_req *r, enum ollama_action *action,
    struct api_error *e)
{
	json_t *o, *keep;
	double keep_s = 0;
	int rc = -1, empty = 0;

	memset(r, 0, sizeof *r);
	e->message[0] = '\0';
	r->dialect = d;
	r->n = 1;
	*action = OLLAMA_GENERATE;
	if ((o = api_body(body, len, e)) == NULL)
		return -1;
	keep = api_field(o, "keep_alive");
	if (parse_model(o, r, e) != 0 || parse_stream(o, r, e) != 0 ||
	    (keep != NULL && ollama_keep_alive(keep, &keep_s, e) != 0) ||
	    (d == API_OLLAMA_CHAT ? parse_chat(o, r, &empty, e) : parse_generate(o, r, &empty, e)) != 0)
		goto out;
	if (empty) {
		*action = keep != NULL && keep_s == 0 ? OLLAMA_UNLOAD : OLLAMA_LOAD;
		rc = 0;
		goto out;
	}
	if (parse_think(o, r, e) != 0 || parse_format(o, r, e) != 0 || parse_options(o, r, e) != 0 ||
	    api_parse_logprobs(o, r, e) != 0)
		goto out;
	if (keep != NULL)
		add_num(r, "keep_alive", 0, 0, keep_s);
	add_num(r, "seed", 1, random_seed(), 0);
	rc = 0;
out:
	json_decref(o);
	if (rc != 0)
		api_req_free(r);
	return rc;
}

char *
ollama_parse_model(const char *body, size_t len, struct api_error *e)
{
	json_t *o = api_body(body, len, e), *m;
	char *model = NULL;

	if (o == NULL)
		return NULL;
	/* name: the field's name before Ollama 0.3 */
	if ((m = api_field(o, "model")) == NULL)
		m = api_field(o, "name");
	if (!json_is_string(m) || json_string_length(m) == 0)
		api_bad(e, "model", "model is required: one of the names of GET /api/tags");
	else if ((model = strdup(json_string_value(m))) == NULL)
		api_nomem(e);
	json_decref(o);
	return model;
}

const char *
ollama_resolve(char *const *names, size_t n, const char *asked)
{
	size_t i, len = strlen(asked), base = len - strlen(LATEST);

	for (i = 0; i < n; i++)
		if (strcmp(names[i], asked) == 0)
			return names[i];
	if (len <= strlen(LATEST) || strcmp(asked + base, LATEST) != 0)
		return NULL;
	for (i = 0; i < n; i++)
		if (strlen(names[i]) == base && strncmp(names[i], asked, base) == 0)
			return names[i];
	return NULL;
}

/* ---- replies ---- */

void
ollama_time(char *buf, size_t size, double t)
{
	double whole = floor(t);
	time_t s = (time_t)whole;
	long ns = (long)((t - whole) * 1e9);
	struct tm tm;
	size_t n;

	gmtime_r(&s, &tm);
	n = strftime(buf, size, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf + n, size - n, ".%09ldZ", ns > 999999999 ? 999999999 : ns);
}

static json_t *
time_json(double t)
{
	char buf[48];

	ollama_time(buf, sizeof buf, t);
	return json_string(buf);
}

json_t *
ollama_error_json(const struct api_error *e)
{
	return json_pack("{so}", "error", api_text_json(e->message));
}

/* What every object of a reply starts with: the model as the client named it, and the time. */
static json_t *
reply_head(const char *model)
{
	return json_pack("{ss so}", "model", model, "created_at", time_json(ollama_now()));
}

/* Where a reply's text goes: chat's message (made here), generate's object itself. */
static json_t *
reply_body(const struct api_req *r, json_t *o)
{
	json_t *msg;

	if (r->dialect != API_OLLAMA_CHAT)
		return o;
	msg = json_pack("{ss}", "role", "assistant");
	json_object_set_new(o, "message", msg);
	return msg;
}

/* Sets text (chat's content, generate's response) and reasoning (thinking, unless think was false). */
static json_t *
set_text(const struct api_req *r, json_t *o, const char *text, const char *reasoning)
{
	json_t *body = reply_body(r, o);

	json_object_set_new(body, r->dialect == API_OLLAMA_CHAT ? "content" : "response", api_text_json(text));
	if (reasoning != NULL && reasoning[0] != '\0' && !r->hide_reasoning)
		json_object_set_new(body, "thinking", api_text_json(reasoning));
	return body;
}

/* Ollama's logprobs: the entries of OpenAI chat's logprobs.content, the same {token, logprob, bytes, top_logprobs}. */
static void
set_logprobs(json_t *o, json_t *logprobs)
{
	json_t *content = json_object_get(logprobs, "content");

	if (content != NULL)
		json_object_set(o, "logprobs", content);
	json_decref(logprobs);
}

/* Ollama's tool_calls of the daemon's: [{id, function: {index, name, arguments (an object)}}]. */
static json_t *
calls_json(const json_t *calls)
{
	json_t *a = json_array(), *args, *v;
	size_t i;

	json_array_foreach(calls, i, v) {
		/* the daemon's arguments are always an object's JSON text (PROTOCOL.md, Tool calls) */
		if ((args = json_loads(str(v, "arguments"), 0, NULL)) == NULL)
			args = json_object();
		json_array_append_new(a, json_pack("{ss s{sI ss so}}", "id", str(v, "id"), "function", "index",
		    (json_int_t)i, "name", str(v, "name"), "arguments", args));
	}
	return a;
}

json_t *
ollama_chunk(const struct api_req *r, const struct api_meta *m, const char *text, const char *reasoning,
    json_t *logprobs)
{
	json_t *o = reply_head(m->model);

	set_text(r, o, text, reasoning);
	json_object_set_new(o, "done", json_false());
	set_logprobs(o, logprobs);
	return o;
}

json_t *
ollama_calls_chunk(const struct api_req *r, const struct api_meta *m, const json_t *calls)
{
	json_t *o = reply_head(m->model);

	json_object_set_new(set_text(r, o, "", NULL), "tool_calls", calls_json(calls));
	json_object_set_new(o, "done", json_false());
	return o;
}

/* Nanoseconds of seconds, as Ollama's durations are. */
static json_t *
ns_json(double seconds)
{
	return json_integer(seconds > 0 ? (json_int_t)llround(seconds * 1e9) : 0);
}

json_t *
ollama_final(const struct api_req *r, const struct api_meta *m, struct ollama_end *end)
{
	const char *reason = api_finish_reason(end->finish);
	int calls = end->whole && json_array_size(end->calls) > 0;
	json_t *o = reply_head(m->model), *body;
	const struct api_usage *u = &end->u;

	/* calls the model wrote as its answer (Llama 3.1's, Gemma's) are the calls, not content; nor is blank text */
	body = set_text(r, o, end->whole && !(calls && (end->calls_in_text || api_blank(end->text))) ? end->text : "",
	    end->whole ? end->reasoning : NULL);
	if (calls)
		json_object_set_new(body, "tool_calls", calls_json(end->calls));
	json_object_set_new(o, "done", json_true());
	json_object_set_new(o, "done_reason", json_string(reason ? reason : "stop"));
	/*
	 * The daemon times the first token from the request's arrival
	 * (ttft_ms: queueing and any load included) and the rate after it; it
	 * does not say how long a load took, so load_duration is 0.
	 */
	json_object_set_new(o, "total_duration", ns_json(end->seconds));
	json_object_set_new(o, "load_duration", json_integer(0));
	json_object_set_new(o, "prompt_eval_count", json_integer((json_int_t)u->prompt));
	json_object_set_new(o, "prompt_eval_duration", ns_json(u->ttft_ms / 1e3));
	json_object_set_new(o, "eval_count", json_integer((json_int_t)u->generated));
	json_object_set_new(o, "eval_duration", ns_json(u->tokens_per_s > 0 && u->generated > 1 ?
	    (double)(u->generated - 1) / u->tokens_per_s : 0));
	set_logprobs(o, end->logprobs);
	end->logprobs = NULL;
	return o;
}

json_t *
ollama_loaded(enum api_dialect d, const char *asked, enum ollama_action action)
{
	struct api_req r = { .dialect = d };
	json_t *o = reply_head(asked);

	set_text(&r, o, "", NULL);
	json_object_set_new(o, "done", json_true());
	json_object_set_new(o, "done_reason", json_string(action == OLLAMA_UNLOAD ? "unload" : "load"));
	return o;
}

/* ---- the model routes ---- */

json_t *
ollama_name(const char *name)
{
	size_t n = strlen(name);
	char *s;
	json_t *j;

	if (strchr(name, ':') != NULL || (s = malloc(n + sizeof LATEST)) == NULL)
		return json_string(name);
	memcpy(s, name, n);
	memcpy(s + n, LATEST, sizeof LATEST);
	j = json_string(s);
	free(s);
	return j;
}

/* A count of parameters as Ollama writes one: 8.0B, 268.10M, 7K. */
static json_t *
parameter_size(uint64_t n)
{
	char buf[32];
	double x;

	if (n >= 1000000000)
		x = n / 1e9, snprintf(buf, sizeof buf, x == floor(x) ? "%.0fB" : "%.1fB", x);
	else if (n >= 1000000)
		x = n / 1e6, snprintf(buf, sizeof buf, x == floor(x) ? "%.0fM" : "%.2fM", x);
	else if (n >= 1000)
		snprintf(buf, sizeof buf, "%.0fK", n / 1e3);
	else
		snprintf(buf, sizeof buf, "%llu", (unsigned long long)n);
	return json_string(buf);
}

/*
 * Ollama's details of a model map: its format and family (arch) while
 * model.list has them (a loaded model) or from model.show, its parameters
 * and quantization from model.show; "" what is not known.
 */
static json_t *
details(const json_t *model)
{
	const char *arch = str(model, "arch");
	json_int_t params = json_integer_value(json_object_get(model, "parameters"));

	return json_pack("{ss ss ss so so ss}", "parent_model", "", "format", str(model, "format"), "family", arch,
	    "families", arch[0] ? json_pack("[s]", arch) : json_null(),
	    "parameter_size", params > 0 ? parameter_size((uint64_t)params) : json_string(""),
	    "quantization_level", str(model, "quantization"));
}

json_t *
ollama_tag(const json_t *model, double mtime, uint64_t file_size)
{
	json_int_t size = json_integer_value(json_object_get(model, "size"));
	const char *name = str(model, "name");

	/* no digest: resident keeps the file, not a manifest of layers */
	return json_pack("{so so so sI ss so}", "name", ollama_name(name), "model", ollama_name(name),
	    "modified_at", time_json(mtime), "size", size > 0 ? size : (json_int_t)file_size, "digest", "",
	    "details", details(model));
}

/* The model map of list (a model.list result) named name, or NULL. */
static const json_t *
list_model(const json_t *list, const char *name)
{
	const json_t *m;
	size_t i;

	json_array_foreach(json_object_get(list, "models"), i, m)
		if (strcmp(str(m, "name"), name) == 0)
			return m;
	return NULL;
}

/*
 * When a loaded model is unloaded: expires_in_s from now, unless it is in
 * use (then its keep-alive after now) or kept until its memory is needed
 * (Ollama's "forever": the largest duration it has, about 292 years).
 */
static double
expires_at(const json_t *m, double t)
{
	double in = json_number_value(json_object_get(m, "expires_in_s"));
	double keep = json_number_value(json_object_get(m, "keep_alive_s"));

	if (in >= 0)
		return t + in;
	return keep < 0 ? t + 9223372036.854775807 : t + keep;
}

json_t *
ollama_ps(const json_t *status, const json_t *list, double t)
{
	json_t *models = json_array(), *m;
	json_int_t bytes;
	const char *name;
	size_t i;

	json_array_foreach(json_object_get(status, "models"), i, m) {
		if (!json_is_true(json_object_get(m, "loaded")))
			continue;
		name = str(m, "name");
		bytes = json_integer_value(json_object_get(m, "memory_bytes"));
		json_array_append_new(models, json_pack("{so so sI ss so so sI}", "name", ollama_name(name), "model",
		    ollama_name(name), "size", bytes, "digest", "", "details", details(list_model(list, name)),
		    "expires_at", time_json(expires_at(m, t)),
		    "size_vram", strcmp(str(m, "device"), "cuda") == 0 ? bytes : (json_int_t)0));
	}
	return json_pack("{so}", "models", models);
}

/* Sets model_info's key prefix.name (arch's keys, as GGUF names them) to an uint field of model, if it has it. */
static void
info_uint(json_t *info, const char *prefix, const char *name, const json_t *model, const char *field)
{
	json_t *v = json_object_get(model, field);
	char key[128];

	if (!json_is_integer(v))
		return;
	snprintf(key, sizeof key, "%s.%s", prefix, name);
	json_object_set_new(info, key, json_integer(json_integer_value(v)));
}

/*
 * What a model serves: "embedding" for a model that pools (Ollama's test is
 * a pooling type), else "completion", as Ollama has it one or the other (its
 * clients pick embedding models by it); then what its family of templates
 * renders: tool calls, reasoning apart (PROTOCOL.md, Tool calls and Reasoning).
 */
static json_t *
capabilities(const json_t *model)
{
	static const char *const tools[] = { "llama3", "chatml", "qwen3", "mistral", "harmony", "gemma" };
	static const char *const thinking[] = { "qwen3", "harmony" };
	const char *t = str(model, "template");
	json_t *a = json_pack("[s]", str(model, "pooling")[0] != '\0' ? "embedding" : "completion");
	size_t i;

	if (str(model, "template_error")[0] != '\0')
		return a;
	for (i = 0; i < COUNT(tools); i++)
		if (strcmp(t, tools[i]) == 0)
			json_array_append_new(a, json_string("tools"));
	for (i = 0; i < COUNT(thinking); i++)
		if (strcmp(t, thinking[i]) == 0)
			json_array_append_new(a, json_string("thinking"));
	return a;
}

json_t *
ollama_show(const json_t *model, double mtime)
{
	static const struct {
		const char *name, *field;
	} keys[] = {
		{ "context_length", "context_train" }, { "embedding_length", "embedding" }, { "block_count", "layers" },
		{ "feed_forward_length", "feed_forward" }, { "attention.head_count", "heads" },
		{ "attention.head_count_kv", "kv_heads" }, { "attention.key_length", "head_dim" },
		{ "vocab_size", "vocab" },
	};
	const char *arch = str(model, "arch");
	json_t *info = json_object();
	size_t i;

	json_object_set_new(info, "general.architecture", json_string(arch));
	info_uint(info, "general", "parameter_count", model, "parameters");
	for (i = 0; i < COUNT(keys); i++)
		info_uint(info, arch, keys[i].name, model, keys[i].field);
	if (json_integer_value(json_object_get(model, "sliding_window")) > 0)
		info_uint(info, arch, "attention.sliding_window", model, "sliding_window");
	/* resident's own: the context it serves, and the family its messages are rendered with */
	info_uint(info, "resident", "context_length", model, "context");
	json_object_set_new(info, "resident.template", json_string(str(model, "template")));
	return json_pack("{so so so so}", "details", details(model), "model_info", info,
	    "capabilities", capabilities(model), "modified_at", time_json(mtime));
}
