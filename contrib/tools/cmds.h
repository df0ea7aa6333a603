/* cmds.h: the subcommands of resident-model, one function each. */
#ifndef RESIDENT_CMDS_H
#define RESIDENT_CMDS_H

/*
 * Each takes the arguments from the subcommand's name on (argv[0] is the
 * name), prints its errors to stderr as "resident-model NAME: message",
 * and returns the process exit code.
 */

/* dequant FILE OUTDIR: writes tensor i of a GGUF as OUTDIR/<i>.f32. */
int cmd_dequant(int argc, char **argv);
/* quantize TYPE IN.f32 OUT.bin: raw float32 in, raw blocks out. */
int cmd_quantize(int argc, char **argv);

/* tokenize [--special] [--no-bos] MODEL TEXTFILE: prints the text's ids on one line. */
int cmd_tokenize(int argc, char **argv);
/* detokenize [--special] MODEL ID...: prints the ids' text exactly. */
int cmd_detokenize(int argc, char **argv);
/* vocab FLAVOUR N SEED OUTDIR: a generated vocabulary as tokenizer.json and vocab.gguf. */
int cmd_vocab(int argc, char **argv);

/* run MODEL PROMPT [options]: generates and streams text. */
int cmd_run(int argc, char **argv);
/* logits MODEL --out FILE ID...: every position's logits, raw float32. */
int cmd_logits(int argc, char **argv);
/* perplexity MODEL TEXTFILE: the model's perplexity on a text. */
int cmd_perplexity(int argc, char **argv);

#endif
