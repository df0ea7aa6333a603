/*
 * chat.h: chat templates. A model's Jinja chat template is recognised as one
 * of a few known families and rendered by C code that produces, byte for byte,
 * what the official template renders with transformers' apply_chat_template
 * (tests/unit/test_chat.c holds the proof, tests/data/chat_templates the
 * templates). We do not interpret Jinja: a template of no known family is
 * refused, and the user can pick a family by name or use raw prompts.
 */
#ifndef RESIDENT_CHAT_H
#define RESIDENT_CHAT_H

#include <stddef.h>

enum chat_tmpl {
	CHAT_RAW,     /* no template: the contents, concatenated */
	CHAT_LLAMA3,  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
	CHAT_CHATML,  /* <|im_start|>role\n...<|im_end|>\n (Qwen, SmolLM...) */
	CHAT_GEMMA,   /* <start_of_turn>user|model\n...<end_of_turn>\n */
	CHAT_MISTRAL, /* [INST] ...[/INST] ...</s>: Mistral's "v3" template */
	CHAT_LLAMA2,  /* [INST] <<SYS>>...<</SYS>> ... [/INST] ... </s> */
	CHAT_QWEN3,   /* ChatML with <think>...</think> reasoning in assistant turns */
	CHAT_HARMONY, /* gpt-oss: <|start|>role<|channel|>...<|message|>...<|end|> */
	CHAT_MISTRAL_V1, /* <s> [INST] ... [/INST] ...</s>: Mistral's "v1" (Mixtral 8x7B) */
};

/* The last family of enum chat_tmpl, for loops over all of them. */
#define CHAT_TMPL_LAST CHAT_MISTRAL_V1

/* A tool call an assistant message made (chat_tools.h). */
struct chat_call {
	char *id;              /* NULL or "": none given */
	char *name;
	char *arguments;       /* JSON text of an object */
};

struct chat_msg {
	const char *role;      /* "system", "user", "assistant" or "tool" */
	const char *content;   /* UTF-8 */
	const char *reasoning; /* an assistant turn's reasoning, apart from its content (Qwen3's
	                          reasoning_content, harmony's thinking); NULL: none given */
	const struct chat_call *calls; /* an assistant turn's tool calls */
	size_t n_calls;
	const char *tool_call_id; /* a tool message: the call it answers (NULL: none given) */
	const char *name;      /* a tool message: the tool's name (NULL: none given) */
};

/*
 * Recognises the family of a Jinja chat template (GGUF
 * tokenizer.chat_template, or tokenizer_config.json's chat_template) by
 * its distinctive markers, in the order llama.cpp's
 * llm_chat_detect_template checks them. Returns 0 and *out;
 * ERR_NOTFOUND if src is NULL or empty (the model has no template);
 * ERR_UNSUPPORTED with a message quoting the template's start if it is of
 * no family we render exactly (including Mistral's Tekken and v7 variants,
 * ChatML look-alikes such as Phi-4, and ChatML templates with reasoning
 * other than Qwen3's, such as QwQ's, which opens <think> in the generation
 * prompt). Qwen3's template is told from plain ChatML by the line that
 * renders a kept reasoning block and by its enable_thinking switch,
 * gpt-oss's by <|start|> and <|channel|>, Mistral's v1 as llama.cpp does
 * (' [INST] ' + system_message).
 */
int chat_detect(const char *src, enum chat_tmpl *out, char *err);

/*
 * The family's name: "raw", "llama3", "chatml", "gemma", "mistral",
 * "llama2", "qwen3", "harmony", "mistral-v1".
 */
const char *chat_tmpl_name(enum chat_tmpl t);

/* The family of a name as chat_tmpl_name writes it (a config override). 0 or ERR_INVAL. */
int chat_tmpl_from_name(const char *name, enum chat_tmpl *out, char *err);

/*
 * How much a model that reasons before it answers is asked to: as its
 * template does by default; not at all (Qwen3: enable_thinking=false, an
 * empty think block opens the reply; gpt-oss cannot answer without its
 * analysis and takes it as low); or gpt-oss's reasoning effort (Qwen3:
 * as the default). The other families have no such switch.
 */
enum chat_think { THINK_DEFAULT, THINK_OFF, THINK_LOW, THINK_MEDIUM, THINK_HIGH };

/* How to render; all zeros are the templates' defaults. */
struct chat_opts {
	int add_generation_prompt;
	const char *bos_text; /* the model's BOS text; NULL: the family's usual one */
	const char *date;     /* harmony's "Current date", YYYY-MM-DD; NULL: today, local time */
	enum chat_think think;
	const char *tools;    /* the tools offered, as chat_tools_check writes them; NULL: none */
};

/*
 * Renders a conversation into the prompt text. *out is malloc'd,
 * NUL-terminated, *out_len bytes long; the caller frees it.
 *
 * Contract with the tokenizer: the text contains the special tokens as text
 * (BOS included where the family's template writes it: llama3, gemma,
 * mistral, llama2, mistral-v1). The caller tokenizes it with parse_special
 * and adds no BOS of its own. bos_text is the model's BOS token text
 * ("<|begin_of_text|>", "<bos>", "<s>"); NULL means the family's usual one.
 * ChatML, Qwen3 and harmony use no BOS. Llama 2 and Mistral end assistant
 * turns with "</s>", the EOS text of every vocabulary of those families.
 * CHAT_RAW writes the contents as they are, with no BOS: there the caller
 * adds BOS if the tokenizer asks for it.
 *
 * add_generation_prompt appends the header of an assistant turn (llama3,
 * chatml, gemma, qwen3: "<|im_start|>assistant\n", harmony:
 * "<|start|>assistant"); the Mistral and Llama 2 templates have none, as
 * the official ones.
 *
 * Errors (ERR_INVAL, the message says which message is wrong): an unknown
 * role, a NULL or non-UTF-8 content, no messages (except CHAT_RAW), a date
 * that is not YYYY-MM-DD, and whatever the official template rejects: for
 * gemma, mistral, llama2 and mistral-v1, after an optional first system
 * message, turns must alternate user, assistant, user...; for harmony, an
 * assistant content holding "<|channel|>analysis<|message|>" or
 * "<|channel|>final<|message|>". A system message anywhere but first is
 * refused for those five families too (their templates would drop it or
 * render a malformed turn). Templates differ on what they do with details,
 * reproduced here: gemma and mistral-v1 put the system text in the first
 * user turn; mistral puts it in the last user turn, and drops it when the
 * conversation ends with an assistant turn; harmony puts it under
 * "# Instructions" in a developer message (none for an empty one); llama3
 * and gemma strip whitespace around contents, mistral around assistant
 * contents, llama2 around whole turns (as Python's str.strip). Qwen3 cuts
 * the <think>...</think> reasoning out of the assistant turns before the
 * last user query (the last user turn that is not one <tool_response>
 * block); after it, a turn's reasoning is rendered in a think block where
 * it is not empty, and in the conversation's last turn even when it is. A
 * turn's reasoning is its chat_msg.reasoning where given (its content is
 * then all reply), else what its content holds before </think>.
 * Harmony renders an assistant turn as its final channel, ending the
 * conversation's last turn with <|return|> when no reply is to follow;
 * its reasoning only then, as an analysis message before it (the official
 * template's training case: inference drops past reasoning), and refuses
 * <|channel|> tags in the reasoning as in the content.
 *
 * Reference templates: Meta-Llama-3-8B-Instruct, Qwen2.5-Instruct (ChatML;
 * its default system prompt for conversations without one is not
 * inserted), gemma-3-*-it, Mistral-7B-Instruct-v0.3, Llama-2-*-chat,
 * Qwen3 (Qwen3-0.6B ... Qwen3-30B-A3B), gpt-oss-20b/120b (system message
 * with the default model identity and "Reasoning: medium" unless
 * chat_opts.think says otherwise, no tools),
 * Mixtral-8x7B-Instruct-v0.1. Llama 3.1+ templates are rendered as
 * Llama 3 (without the date preamble they add to the system turn).
 */
int chat_render_opts(enum chat_tmpl t, const struct chat_msg *msgs, size_t n,
    const struct chat_opts *o, char **out, size_t *out_len, char *err);

/* chat_render_opts with the given generation prompt and BOS, the rest default. */
int chat_render(enum chat_tmpl t, const struct chat_msg *msgs, size_t n,
    int add_generation_prompt, const char *bos_text, char **out,
    size_t *out_len, char *err);

#endif
