/*
 * guard.c: which requests the bridge answers at all, its door for web
 * pages. A page in the user's browser may send requests to any address,
 * localhost included: a POST with a body of type text/plain needs no
 * preflight, and DNS rebinding (a page's own server name pointed at
 * 127.0.0.1 once the page is loaded) makes the bridge the page's own origin
 * in the browser's eyes. Either would let any web site use residentd's
 * models and the sessions of the bridge's user (Ollama's CVE-2024-28224).
 * So, before the routes:
 *
 *   Host    a name the bridge is known by: localhost and *.localhost (which
 *           browsers resolve to loopback themselves), an IP address (a
 *           client names the address it reached; rebinding needs a name),
 *           --listen's name, --allow-host's; else 403. Without a Host
 *           (HTTP/1.0), or on a Unix socket listener, there is nothing to
 *           check.
 *   Origin  absent (not a browser), the request's own (http:// and its
 *           Host), or one of --allow-origin's; else 403. An allowed other
 *           origin gets CORS' headers, and its preflights (OPTIONS with
 *           Access-Control-Request-Method) are answered here with 204.
 *   body    a POST's Content-Type, when it has one, is application/json
 *           (every POST route takes JSON); else 415, which is what a
 *           page's form or text/plain request gets.
 *
 * A page's GET without Origin (an <img>, a no-cors fetch) is answered: no
 * GET route changes anything, and the page cannot read the reply.
 */
#include "config.h"
#include "openai.h"
#include "log.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <event2/http.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define GUARD_MAX_AGE "600"             /* seconds a browser may keep a preflight's answer */
#define GUARD_ALLOW_METHODS "GET, POST, OPTIONS"
/* what pages may read of a reply besides CORS' safelisted headers */
#define GUARD_EXPOSE_HEADERS "X-Resident-Session"

/*
 * The request headers a preflight is answered yes for: the ones the
 * routes read, and the ones the openai and ollama client libraries send
 * from a page (the x-stainless-* family as a prefix). Others are left out
 * of the answer, and the browser then refuses to send the request.
 */
static const char *const safe_headers[] = {
	"accept", "accept-language", "authorization", "content-type", "user-agent", "x-requested-with",
	"x-resident-session", "openai-organization", "openai-project", "openai-beta", "x-stainless-*",
};

/* ---- settings ---- */

/* Whether s (len bytes) is an IPv4 address in dotted form or an IPv6 one (without brackets). */
static int
is_address(const char *s, size_t len)
{
	unsigned char bin[16];
	char buf[INET6_ADDRSTRLEN];

	if (len == 0 || len >= sizeof buf)
		return 0;
	memcpy(buf, s, len);
	buf[len] = '\0';
	return inet_pton(AF_INET, buf, bin) == 1 || inet_pton(AF_INET6, buf, bin) == 1;
}

/* Appends s to list (n of GUARD_MAX_NAMES). 0, or -1 with msg. */
static int
add_name(const char **list, size_t *n, const char *s, char *msg, size_t size)
{
	if (*n == GUARD_MAX_NAMES) {
		snprintf(msg, size, "at most %d are taken", GUARD_MAX_NAMES);
		return -1;
	}
	list[(*n)++] = s;
	return 0;
}

int
guard_allow_origin(struct guard *g, const char *origin, char *msg, size_t size)
{
	size_t len = strlen(origin), scheme = strspn(origin, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	    "0123456789+.-");
	const char *host = origin + scheme + 3;

	if (len > 0 && origin[len - 1] == '/')
		len--;                          /* as an address bar shows it; listed() ignores it */
	if (strcmp(origin, "*") != 0 && (scheme == 0 || !isalpha((unsigned char)origin[0]) ||
	    strncmp(origin + scheme, "://", 3) != 0 || host >= origin + len ||
	    strcspn(host, "/?#@ ") < (size_t)(origin + len - host))) {
		snprintf(msg, size, "give an origin as the browser sends it, SCHEME://HOST[:PORT] (e.g. "
		    "http://localhost:3000), or * for any");
		return -1;
	}
	return add_name(g->origins, &g->n_origins, origin, msg, size);
}

int
guard_allow_host(struct guard *g, const char *name, char *msg, size_t size)
{
	size_t len = strlen(name);

	if (len == 0 || strcspn(name, ":/[]@ ") != len) {
		snprintf(msg, size, "give a host name without scheme or port (e.g. myhost.lan), or * for any");
		return -1;
	}
	return add_name(g->hosts, &g->n_hosts, name, msg, size);
}

/* Whether list (n entries) holds "*", which stands for any. */
static int
holds_any(const char *const *list, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (strcmp(list[i], "*") == 0)
			return 1;
	return 0;
}

void
guard_warn(const struct oa *oa)
{
	const struct guard *g = &oa->guard;

	if (oa->api_key != NULL)
		return;
	if (holds_any(g->origins, g->n_origins))
		log_warn("--allow-origin * without --api-key-file: every web page this user's browser opens "
		    "can use residentd's models and this user's sessions");
	if (holds_any(g->hosts, g->n_hosts))
		log_warn("--allow-host * without --api-key-file: a web page whose server name is pointed at this "
		    "machine (DNS rebinding) can use residentd's models and this user's sessions");
}

/* ---- checks ---- */

/* Whether s (len bytes) is one of list (an entry's trailing '/' aside), or list holds "*". */
static int
listed(const char *const *list, size_t n, const char *s, size_t len)
{
	size_t i, l;

	for (i = 0; i < n; i++) {
		if (strcmp(list[i], "*") == 0)
			return 1;
		l = strlen(list[i]);
		if (l > 1 && list[i][l - 1] == '/')
			l--;
		if (l == len && strncasecmp(list[i], s, len) == 0)
			return 1;
	}
	return 0;
}

/* Whether the Host header host (HOST[:PORT], [V6]:PORT) names the bridge. */
static int
host_known(const struct guard *g, const char *host)
{
	const char *end;
	size_t len;

	if (host[0] == '[') {
		end = strchr(host, ']');
		return end != NULL && (end[1] == '\0' || end[1] == ':') && is_address(host + 1, (size_t)(end - host - 1));
	}
	len = strcspn(host, ":");
	if (is_address(host, len) || (len == 9 && strncasecmp(host, "localhost", 9) == 0) ||
	    (len > 10 && strncasecmp(host + len - 10, ".localhost", 10) == 0))
		return 1;
	return (g->listen_name != NULL && strlen(g->listen_name) == len && strncasecmp(g->listen_name, host, len) == 0) ||
	    listed(g->hosts, g->n_hosts, host, len);
}

/* Whether origin is that of a page the request's own host:port served (origin http://HOST). */
static int
same_origin(const char *origin, const char *host)
{
	return host != NULL && strncasecmp(origin, "http://", 7) == 0 && strcasecmp(origin + 7, host) == 0;
}

/* The method of req, for the log. */
static const char *
method_name(struct evhttp_request *req)
{
	switch (evhttp_request_get_command(req)) {
	case EVHTTP_REQ_GET: return "GET";
	case EVHTTP_REQ_POST: return "POST";
	case EVHTTP_REQ_HEAD: return "HEAD";
	case EVHTTP_REQ_OPTIONS: return "OPTIONS";
	case EVHTTP_REQ_PUT: return "PUT";
	case EVHTTP_REQ_DELETE: return "DELETE";
	default: return "?";
	}
}

/* Refuses req with status (403, 415) and code, the stable code of its error; the log says why. */
static void
refuse(struct evhttp_request *req, int status, const char *code, const char *message)
{
	const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
	struct api_error e;

	api_error_set(&e, status, "invalid_request_error", NULL, code, "%s", message);
	log_info("%s %s %d %s", method_name(req), path ? path : "/", status, e.message);
	http_send_error(req, &e);
}

/* Whether header (len bytes, in any case) is one of safe_headers. */
static int
safe_header(const char *h, size_t len)
{
	size_t i, n;

	for (i = 0; i < sizeof safe_headers / sizeof safe_headers[0]; i++) {
		n = strlen(safe_headers[i]);
		if (safe_headers[i][n - 1] == '*' ? len >= n && strncasecmp(h, safe_headers[i], n - 1) == 0 :
		    len == n && strncasecmp(h, safe_headers[i], n) == 0)
			return 1;
	}
	return 0;
}

/* Answers a preflight of an allowed origin: 204, the methods, the asked headers that are safe. */
static void
preflight(struct evhttp_request *req)
{
	const char *asked = evhttp_find_header(evhttp_request_get_input_headers(req), "Access-Control-Request-Headers");
	char allow[1024] = "";
	size_t at = 0, len;

	while (asked != NULL && *asked != '\0') {
		asked += strspn(asked, " \t,");
		len = strcspn(asked, " \t,");
		if (len > 0 && safe_header(asked, len) && at + len + 3 < sizeof allow)
			at += (size_t)snprintf(allow + at, sizeof allow - at, "%s%.*s", at ? ", " : "", (int)len, asked);
		asked += len;
	}
	http_add_header(req, "Access-Control-Allow-Methods", GUARD_ALLOW_METHODS);
	if (at > 0)
		http_add_header(req, "Access-Control-Allow-Headers", allow);
	http_add_header(req, "Access-Control-Max-Age", GUARD_MAX_AGE);
	evhttp_send_reply(req, 204, "No Content", NULL);
}

int
guard_request(struct oa *oa, struct evhttp_request *req)
{
	struct evkeyvalq *in = evhttp_request_get_input_headers(req);
	const char *host = evhttp_find_header(in, "Host"), *origin = evhttp_find_header(in, "Origin");
	char msg[512];

	if (host != NULL && !oa->unix_listener && !host_known(&oa->guard, host)) {
		snprintf(msg, sizeof msg, "Host %.200s is not a name of resident-http: it answers localhost, *.localhost, "
		    "its IP addresses and its --listen name, so that a web page whose server name was pointed at this "
		    "machine (DNS rebinding) cannot use it; to be reached by another name, start it with --allow-host "
		    "NAME", host);
		refuse(req, 403, "host_not_allowed", msg);
		return 0;
	}
	if (origin == NULL)
		return 1;
	if (!same_origin(origin, host) && !listed(oa->guard.origins, oa->guard.n_origins, origin, strlen(origin))) {
		snprintf(msg, sizeof msg, "a web page of origin %.120s may not use resident-http: start it with "
		    "--allow-origin %.120s to let pages of that origin in (see man resident-http, SECURITY)",
		    origin, strcmp(origin, "null") == 0 ? "'*'" : origin);
		refuse(req, 403, "origin_not_allowed", msg);
		return 0;
	}
	http_add_header(req, "Access-Control-Allow-Origin", origin);
	http_add_header(req, "Vary", "Origin");
	http_add_header(req, "Access-Control-Expose-Headers", GUARD_EXPOSE_HEADERS);
	if (evhttp_request_get_command(req) == EVHTTP_REQ_OPTIONS &&
	    evhttp_find_header(in, "Access-Control-Request-Method") != NULL) {
		preflight(req);
		return 0;
	}
	return 1;
}

int
guard_body(struct evhttp_request *req)
{
	const char *type = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type");
	char msg[512];
	size_t len;

	if (evhttp_request_get_command(req) != EVHTTP_REQ_POST || type == NULL)
		return 1;
	type += strspn(type, " \t");
	len = strcspn(type, "; \t");
	if (len == 16 && strncasecmp(type, "application/json", 16) == 0)
		return 1;
	snprintf(msg, sizeof msg, "the body must be JSON, sent with Content-Type: application/json, not %.100s "
	    "(curl: -H 'Content-Type: application/json'; -d alone sends a form's type)", type);
	refuse(req, 415, "unsupported_media_type", msg);
	return 0;
}
