/*
 * fuzz_chat.c: libFuzzer target for the chat templates (daemon/model/chat.c).
 *
 * Input: byte 0 picks the family (mod the number of families) and byte 1
 * the options (bit 0: add_generation_prompt, bit 1: a BOS text of the
 * input's own instead of the family's, bit 2: Qwen3's thinking off, bit 3:
 * a harmony date of the input's own instead of today's, bit 4: the input's
 * own tools, where chat_tools_check takes them); the rest is split
 * at NUL bytes into messages, each one's first byte picking its role
 * (system, user, assistant, or one no template knows) and the remaining
 * bytes its content, which need not be UTF-8. The same rest is also given
 * to chat_detect and chat_tmpl_from_name as a template's source and a
 * family's name.
 *
 * Whatever the input: chat_render_opts either refuses with ERR_INVAL and a
 * message, or returns valid UTF-8 of exactly out_len bytes; it refuses
 * whenever a content is not UTF-8 or a role is unknown. chat_detect
 * returns a family or a message.
 *
 * Run (from a build configured with --enable-fuzz CC=clang):
 *   tests/fuzz/fuzz_chat -max_total_time=600 -max_len=4096 CORPUS $(SRCDIR)/tests/fuzz/corpus/chat
 */
#include "config.h"
#include "chat.h"
#include "chat_tools.h"
#include "fuzz.h"
#include "util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MSGS 64

static const char *const roles[] = { "system", "user", "assistant", "function" };

/* Splits rest (NUL-terminated, n bytes before the NUL) into messages; returns how many. */
static size_t
split(char *rest, size_t n, struct chat_msg *m, int *all_valid)
{
	size_t k = 0;
	char *p = rest, *end = rest + n, *nul;

	*all_valid = 1;
	while (p < end && k < MAX_MSGS) {
		nul = memchr(p, '\0', (size_t)(end - p));
		if (nul == NULL)
			nul = end;
		m[k] = (struct chat_msg){ .role = roles[(uint8_t)*p % 4], .content = p + (p < nul) };
		if (m[k].role == roles[3] || !utf8_valid(m[k].content, (size_t)(nul - m[k].content)))
			*all_valid = 0;
		k++;
		p = nul + 1;
	}
	return k;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct chat_msg m[MAX_MSGS];
	struct chat_opts o;
	enum chat_tmpl t, found;
	char err[ERR_LEN], *rest, *out = NULL, *tools = NULL;
	size_t n, out_len = 0, n_tools;
	int rc, all_valid;

	if (size < 2)
		return 0;
	t = (enum chat_tmpl)(data[0] % (CHAT_TMPL_LAST + 1));
	rest = xmalloc(size - 1);
	memcpy(rest, data + 2, size - 2);
	rest[size - 2] = '\0';
	err[0] = '\0';
	rc = chat_detect(rest, &found, err);
	FUZZ_CHECK(rc == 0 || rc == ERR_NOTFOUND || rc == ERR_UNSUPPORTED);
	FUZZ_CHECK(rc != 0 || (found >= CHAT_RAW && found <= CHAT_TMPL_LAST));
	FUZZ_CHECK(rc != ERR_UNSUPPORTED || (err[0] != '\0' && memchr(err, '\0', ERR_LEN) != NULL));
	if (chat_tmpl_from_name(rest, &found, err) == 0)
		FUZZ_CHECK(strcmp(chat_tmpl_name(found), rest) == 0);
	n = split(rest, size - 2, m, &all_valid);
	if ((data[1] & 16) && chat_tools_check(rest, &tools, &n_tools, err) == 0)
		FUZZ_CHECK(tools != NULL && n_tools > 0);
	o = (struct chat_opts){ .add_generation_prompt = data[1] & 1, .bos_text = (data[1] & 2) ? rest : NULL,
	    .think = (data[1] & 4) ? (enum chat_think)((data[1] >> 5) % (THINK_HIGH + 1)) : THINK_DEFAULT, .date = (data[1] & 8) ? rest : NULL, .tools = tools };
	rc = chat_render_opts(t, m, n, &o, &out, &out_len, err);
	if (rc == 0) {
		FUZZ_CHECK(all_valid);
		FUZZ_CHECK(out != NULL && strlen(out) == out_len);
		/* a BOS text of the input's own may be anything: only the rest must be UTF-8 */
		FUZZ_CHECK((data[1] & 2) || utf8_valid(out, out_len));
	} else {
		FUZZ_CHECK(rc == ERR_INVAL && err[0] != '\0');
	}
	free(out);
	free(tools);
	free(rest);
	return 0;
}
