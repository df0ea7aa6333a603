/*
 * resident-http: OpenAI's and Ollama's HTTP APIs in front of residentd.
 *
 * Flags, the listening socket, signals. SIGTERM or SIGINT stops it at once:
 * daemon connections are closed (residentd cancels their generations) and
 * HTTP connections with them. residentd need not run when the bridge
 * starts: until it does, requests are answered 503.
 */
#include "config.h"
#include "openai.h"
#include "log.h"

#include <errno.h>
#include <event2/event.h>
#include <event2/http.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define DEFAULT_LISTEN "127.0.0.1:8080"
#define OLLAMA_LISTEN "127.0.0.1:11434"    /* Ollama's, where its clients look by default */
#define DEFAULT_MAX_BODY (16u << 20)
#define DEFAULT_MAX_UNREAD (1u << 20)
#define DEFAULT_IDLE_TIMEOUT 15
#define DEFAULT_REQUEST_TIMEOUT 30
#define MAX_TIMEOUT 86400
#define API_KEY_MAX 4096

struct settings {
	const char *listen, *socket, *api_key_file, *log_level;
	const char *unix_path;      /* --listen unix:PATH's PATH; NULL for an address */
	int ollama;
	unsigned long long max_body, max_unread, idle_timeout, request_timeout;
	struct guard *guard;        /* --allow-origin's and --allow-host's go there */
};

static void
usage(FILE *fp)
{
	fprintf(fp,
	    "usage: resident-http [options]\n"
	    "Serves OpenAI's API (GET /v1/models, POST /v1/chat/completions, POST /v1/completions)\n"
	    "and Ollama's (/api/tags, /api/ps, /api/show, /api/chat, /api/generate, ...) with the\n"
	    "models of residentd.\n"
	    "\n"
	    "      --listen ADDR:PORT   address to serve ([::1]:PORT for IPv6; port 0 takes a free one,\n"
	    "                           printed at start), or unix:PATH (a Unix socket, mode 0600);\n"
	    "                           default: Ollama's " OLLAMA_LISTEN " when it is free, else\n"
	    "                           " DEFAULT_LISTEN "\n"
	    "      --ollama             serve on " OLLAMA_LISTEN " or fail (where Ollama's clients look)\n"
	    "  -s, --socket PATH        residentd's socket (default $RESIDENT_SOCKET, else\n"
	    "                           $XDG_RUNTIME_DIR/resident/socket, else /tmp/resident-UID/socket)\n"
	    "      --api-key-file FILE  ask every request for \"Authorization: Bearer KEY\", KEY being\n"
	    "                           the first line of FILE\n"
	    "      --allow-origin ORIGIN  let web pages of ORIGIN (e.g. http://localhost:3000) use it,\n"
	    "                           with CORS; * for any (repeatable; by default pages are refused)\n"
	    "      --allow-host NAME    answer requests for Host NAME too (besides localhost, its IP\n"
	    "                           addresses and its --listen name; * for any; repeatable)\n"
	    "      --max-body BYTES     largest request body (default 16 MiB)\n"
	    "      --max-unread BYTES   bytes of a stream a client may leave unread before it is\n"
	    "                           dropped and its generation cancelled (default 1 MiB)\n"
	    "      --idle-timeout SECONDS     a connection without a request under way is closed\n"
	    "                           after that (default 15)\n"
	    "      --request-timeout SECONDS  a request must arrive whole (line, headers, body)\n"
	    "                           within that of its first byte, and a reply be taken by its\n"
	    "                           client within that (default 30)\n"
	    "  -l, --log-level LEVEL    error, warn, info (default: a line per request), debug\n"
	    "  -h, --help, --version\n");
}

/* A whole decimal number of bytes, at least 1; 0 if malformed. */
static unsigned long long
parse_bytes(const char *s)
{
	unsigned long long v;
	char *end;

	if (s[0] < '0' || s[0] > '9')
		return 0;
	errno = 0;
	v = strtoull(s, &end, 10);
	return errno || *end ? 0 : v;
}

/* Returns 0, 1 (help or version printed) or 2 (a usage error, printed). */
static int
parse_args(int argc, char **argv, struct settings *s)
{
	enum { O_LISTEN = 256, O_OLLAMA, O_KEY, O_BODY, O_UNREAD, O_IDLE, O_REQUEST, O_VERSION, O_ORIGIN, O_HOST };
	static const struct option lo[] = {
		{ "listen", required_argument, NULL, O_LISTEN }, { "ollama", no_argument, NULL, O_OLLAMA },
		{ "socket", required_argument, NULL, 's' },
		{ "api-key-file", required_argument, NULL, O_KEY }, { "max-body", required_argument, NULL, O_BODY },
		{ "max-unread", required_argument, NULL, O_UNREAD }, { "log-level", required_argument, NULL, 'l' },
		{ "allow-origin", required_argument, NULL, O_ORIGIN }, { "allow-host", required_argument, NULL, O_HOST },
		{ "idle-timeout", required_argument, NULL, O_IDLE },
		{ "request-timeout", required_argument, NULL, O_REQUEST },
		{ "help", no_argument, NULL, 'h' }, { "version", no_argument, NULL, O_VERSION },
		{ NULL, 0, NULL, 0 },
	};
	char msg[256];
	int c;

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":s:l:h", lo, NULL)) != -1) {
		switch (c) {
		case O_LISTEN:
			s->listen = optarg;
			s->unix_path = strncmp(optarg, "unix:", 5) == 0 ? optarg + 5 : NULL;
			break;
		case O_OLLAMA: s->ollama = 1; break;
		case 's': s->socket = optarg; break;
		case O_KEY: s->api_key_file = optarg; break;
		case 'l': s->log_level = optarg; break;
		case O_ORIGIN:
		case O_HOST:
			if ((c == O_ORIGIN ? guard_allow_origin : guard_allow_host)(s->guard, optarg, msg, sizeof msg) != 0) {
				fprintf(stderr, "resident-http: --%s %s: %s\n", c == O_ORIGIN ? "allow-origin" : "allow-host",
				    optarg, msg);
				return 2;
			}
			break;
		case O_BODY:
		case O_UNREAD:
			if (parse_bytes(optarg) == 0) {
				fprintf(stderr, "resident-http: --%s takes a number of bytes, not '%s'\n",
				    c == O_BODY ? "max-body" : "max-unread", optarg);
				return 2;
			}
			*(c == O_BODY ? &s->max_body : &s->max_unread) = parse_bytes(optarg);
			break;
		case O_IDLE:
		case O_REQUEST:
			if (parse_bytes(optarg) == 0 || parse_bytes(optarg) > MAX_TIMEOUT) {
				fprintf(stderr, "resident-http: --%s takes whole seconds, 1..%d, not '%s'\n",
				    c == O_IDLE ? "idle-timeout" : "request-timeout", MAX_TIMEOUT, optarg);
				return 2;
			}
			*(c == O_IDLE ? &s->idle_timeout : &s->request_timeout) = parse_bytes(optarg);
			break;
		case 'h': usage(stdout); return 1;
		case O_VERSION: printf("resident-http %s\n", PACKAGE_VERSION); return 1;
		case ':':
			fprintf(stderr, "resident-http: %s needs a value (see resident-http --help)\n",
			    argv[optind - 1]);
			return 2;
		default:
			fprintf(stderr, "resident-http: unknown option %s (see resident-http --help)\n",
			    argv[optind - 1]);
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "resident-http: unexpected argument '%s' (see --help)\n", argv[optind]);
		return 2;
	}
	if (s->ollama && s->listen != NULL) {
		fprintf(stderr, "resident-http: --ollama listens on " OLLAMA_LISTEN ": give it or --listen, not both\n");
		return 2;
	}
	if (s->log_level != NULL) {
		if ((c = log_level_from_name(s->log_level)) < 0) {
			fprintf(stderr, "resident-http: unknown log level '%s' (error, warn, info, debug)\n",
			    s->log_level);
			return 2;
		}
		log_set_level((enum log_level)c);
	}
	return 0;
}

/* Splits ADDR:PORT or [ADDR]:PORT. Returns 0, or -1 if malformed. */
static int
parse_listen(const char *s, char *host, size_t size, unsigned *port)
{
	const char *colon, *end;
	unsigned long long p;

	if (s[0] == '[') {
		if ((end = strchr(s, ']')) == NULL || end[1] != ':')
			return -1;
		colon = end + 1;
		s++;
	} else {
		if ((colon = strrchr(s, ':')) == NULL)
			return -1;
		end = colon;
	}
	if (end == s || (size_t)(end - s) >= size || colon[1] == '\0')
		return -1;
	p = colon[1] == '0' && colon[2] == '\0' ? 0 : parse_bytes(colon + 1);
	if ((p == 0 && strcmp(colon + 1, "0") != 0) || p > 65535)
		return -1;
	memcpy(host, s, (size_t)(end - s));
	host[end - s] = '\0';
	*port = (unsigned)p;
	return 0;
}

/* The key: the first line of the file, without its line end. NULL with a message on failure. */
static char *
read_api_key(const char *path)
{
	char buf[API_KEY_MAX + 2];
	FILE *fp = fopen(path, "r");
	size_t n;

	if (fp == NULL) {
		fprintf(stderr, "resident-http: --api-key-file %s: %s\n", path, strerror(errno));
		return NULL;
	}
	if (fgets(buf, sizeof buf, fp) == NULL)
		buf[0] = '\0';
	fclose(fp);
	n = strcspn(buf, "\r\n");
	buf[n] = '\0';
	if (n == 0 || n > API_KEY_MAX) {
		fprintf(stderr, "resident-http: --api-key-file %s: the first line must hold a key of 1..%d bytes\n",
		    path, API_KEY_MAX);
		return NULL;
	}
	return strdup(buf);
}

/* Logs where it listens; warns when that is more than this machine without a key. */
static void
log_listening(const struct oa *oa, struct evhttp_bound_socket *bound, const char *listen)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	char host[NI_MAXHOST], port[NI_MAXSERV], sock[4096];
	int v6, loopback;

	if (oa->socket != NULL)
		snprintf(sock, sizeof sock, "%s", oa->socket);
	else if (rs_default_socket(sock, sizeof sock) != 0)
		snprintf(sock, sizeof sock, "(the default)");
	if (oa->unix_listener) {
		log_info("resident-http %s listening on %s (OpenAI's API under /v1, Ollama's under /api), residentd at %s",
		    PACKAGE_VERSION, listen, sock);
		return;
	}
	if (getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&ss, &len) != 0 ||
	    getnameinfo((struct sockaddr *)&ss, len, host, sizeof host, port, sizeof port,
	    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
		snprintf(host, sizeof host, "?"), snprintf(port, sizeof port, "?");
	v6 = ss.ss_family == AF_INET6;
	log_info("resident-http %s listening on http://%s%s%s:%s/v1 (OpenAI's API) and /api (Ollama's), "
	    "residentd at %s", PACKAGE_VERSION, v6 ? "[" : "", host, v6 ? "]" : "", port, sock);
	loopback = v6 ? IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)&ss)->sin6_addr) :
	    (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
	if (!loopback && oa->api_key == NULL)
		log_warn("%s is not a loopback address and no --api-key-file is given: whoever reaches it "
		    "can use residentd's models and this user's sessions", host);
}

/* Listens on addr (ADDR:PORT, checked). NULL with errno set (0: no such address) on failure. */
static struct evhttp_bound_socket *
bind_to(struct oa *oa, const char *addr)
{
	char host[256];
	unsigned port;

	parse_listen(addr, host, sizeof host, &port);
	errno = 0;
	return evhttp_bind_socket_with_handle(oa->http, host, (ev_uint16_t)port);
}

/*
 * Listens on --listen, on Ollama's port with --ollama, and without either
 * on Ollama's port when it is free (so that Ollama's clients find the
 * bridge where they look first) and else on DEFAULT_LISTEN. NULL after
 * saying why.
 */
static struct evhttp_bound_socket *
listen_on(struct oa *oa, const struct settings *s)
{
	const char *addr = s->listen ? s->listen : OLLAMA_LISTEN;
	struct evhttp_bound_socket *bound;
	char err[256];

	if (s->unix_path != NULL) {
		if ((bound = conn_listen_unix(oa, s->unix_path, err, sizeof err)) == NULL)
			fprintf(stderr, "resident-http: cannot listen on %s: %s\n", addr, err);
		return bound;
	}
	bound = bind_to(oa, addr);
	if (bound == NULL && errno == EADDRINUSE && s->listen == NULL && !s->ollama) {
		log_info("%s is in use (by Ollama?): listening on %s instead", OLLAMA_LISTEN, DEFAULT_LISTEN);
		bound = bind_to(oa, addr = DEFAULT_LISTEN);
	}
	if (bound == NULL)
		fprintf(stderr, "resident-http: cannot listen on %s: %s\n", addr, errno ? strerror(errno) :
		    "no such address");
	return bound;
}

/* The check at start that residentd answers (check_daemon). */
struct check {
	rs_client *c;
	struct event *ev;
};

static void
check_result_cb(uint64_t id, const rs_value *hello, void *arg)
{
	if (rs_uint(rs_get(hello, "version")) != RS_PROTOCOL_VERSION)
		log_warn("residentd speaks protocol %llu, resident-http %d",
		    (unsigned long long)rs_uint(rs_get(hello, "version")), RS_PROTOCOL_VERSION);
}

static void
check_error_cb(uint64_t id, rs_status code, const char *message, void *arg)
{
	log_warn("residentd did not answer hello: %s", message);
}

/* Frees the check (NULL members allowed). */
static void
check_end(struct check *k)
{
	if (k->ev != NULL)
		event_free(k->ev);
	rs_close(k->c);
	k->ev = NULL;
	k->c = NULL;
}

/* hello answered, or the connection ended: the check is over. */
static void
check_cb(evutil_socket_t fd, short what, void *arg)
{
	struct check *k = arg;

	if (rs_process(k->c) != RS_OK || rs_pending(k->c) == 0)
		check_end(k);
}

/*
 * Says at start whether residentd answers, so that a wrong socket is seen
 * at once. From the event loop, which waits for no daemon: a stopped one
 * delays only the message.
 */
static void
check_daemon(struct oa *oa, struct check *k)
{
	rs_error err;
	rs_params *p;

	if ((k->c = rs_connect(oa->socket, RS_NONBLOCK, &err)) == NULL) {
		log_warn("%s; requests are answered 503 until it runs (start it with `residentd -m MODEL`)",
		    err.message);
		return;
	}
	/* a hello is a frame the socket of a new connection takes whole: nothing is left unsent */
	if ((p = rs_params_new()) == NULL || rs_params_set_str(p, "client", "resident-http") != RS_OK ||
	    rs_params_set_uint(p, "version", RS_PROTOCOL_VERSION) != RS_OK ||
	    rs_call_start(k->c, "hello", p, check_result_cb, check_error_cb, k) == 0 ||
	    (k->ev = event_new(oa->base, rs_fd(k->c), EV_READ | EV_PERSIST, check_cb, k)) == NULL ||
	    event_add(k->ev, NULL) != 0)
		check_end(k);
	rs_params_free(p);
}

/* libevent's own messages (a failed getaddrinfo, ...): the bridge says what failed itself. */
static void
libevent_log_cb(int severity, const char *msg)
{
	log_debug("libevent: %s", msg);
}

static void
stop_cb(evutil_socket_t sig, short what, void *arg)
{
	log_info("signal %d: stopping", (int)sig);
	event_base_loopbreak(arg);
}

int
main(int argc, char **argv)
{
	struct oa oa = { 0 };
	struct settings s = { .max_body = DEFAULT_MAX_BODY, .max_unread = DEFAULT_MAX_UNREAD,
		.idle_timeout = DEFAULT_IDLE_TIMEOUT, .request_timeout = DEFAULT_REQUEST_TIMEOUT, .guard = &oa.guard };
	struct evhttp_bound_socket *bound;
	struct event *sigterm = NULL, *sigint = NULL;
	struct check check = { 0 };
	char host[256];
	unsigned port;
	size_t i;
	int rc;

	signal(SIGPIPE, SIG_IGN);
	event_set_log_callback(libevent_log_cb);
	if ((rc = parse_args(argc, argv, &s)) != 0)
		return rc == 1 ? 0 : 2;
	if (s.listen != NULL && s.unix_path == NULL) {
		if (parse_listen(s.listen, host, sizeof host, &port) != 0) {
			fprintf(stderr, "resident-http: --listen %s: give ADDR:PORT, e.g. 127.0.0.1:8080 or [::1]:8080, "
			    "or unix:PATH\n", s.listen);
			return 2;
		}
		oa.guard.listen_name = host;
	}
	if (s.api_key_file != NULL && (oa.api_key = read_api_key(s.api_key_file)) == NULL)
		return 2;
	oa.socket = s.socket;
	oa.max_unread = (size_t)s.max_unread;
	oa.idle_timeout = (unsigned)s.idle_timeout;
	oa.request_timeout = (unsigned)s.request_timeout;
	rc = 1;
	if ((oa.base = event_base_new()) == NULL || (oa.http = evhttp_new(oa.base)) == NULL) {
		fprintf(stderr, "resident-http: cannot set up the event loop\n");
		goto out;
	}
	evhttp_set_max_body_size(oa.http, (ev_ssize_t)s.max_body);
	evhttp_set_max_headers_size(oa.http, HTTP_MAX_HEADERS);
	/* OPTIONS for CORS' preflights (guard.c), besides evhttp's default methods */
	evhttp_set_allowed_methods(oa.http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT |
	    EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS);
	evhttp_set_gencb(oa.http, http_request_cb, &oa);
	if ((bound = listen_on(&oa, &s)) == NULL)
		goto out;
	if (conn_setup(&oa, bound) != 0) {
		fprintf(stderr, "resident-http: out of memory\n");
		goto out;
	}
	log_listening(&oa, bound, s.listen);
	guard_warn(&oa);
	check_daemon(&oa, &check);
	sigterm = evsignal_new(oa.base, SIGTERM, stop_cb, oa.base);
	sigint = evsignal_new(oa.base, SIGINT, stop_cb, oa.base);
	event_add(sigterm, NULL);
	event_add(sigint, NULL);
	event_base_dispatch(oa.base);
	rc = 0;
out:
	call_free_all(&oa);
	check_end(&check);
	if (oa.http)
		evhttp_free(oa.http);
	conn_free_all(&oa);
	listener_pause_free(&oa.pause);
	if (oa.unix_listener)
		unlink(s.unix_path);
	if (sigterm)
		event_free(sigterm);
	if (sigint)
		event_free(sigint);
	if (oa.base)
		event_base_free(oa.base);
	for (i = 0; i < oa.n_models; i++)
		free(oa.models[i]);
	free(oa.models);
	free(oa.api_key);
	return rc;
}
