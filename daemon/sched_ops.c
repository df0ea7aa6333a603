/*
 * sched_ops.c: the ops that the engine thread answers at once from the
 * models it keeps: model.list, model.load, model.unload, model.show, and
 * status, which also counts the requests, tokens and KV cache of each
 * model, with histograms of its latencies and of the steps' batches.
 */
#include "config.h"
#include "sched_int.h"
#include "engine.h"
#include "hist.h"
#include "kvdisk.h"
#include "model.h"
#include "slots.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/*
 * Packs a model map with the fields of its description md (NULL: none), and
 * room for n_more fields that the caller packs after.
 */
static void
pack_model(struct sched *s, msgpack_packer *pk, const struct slot *m, const struct model_desc *md, size_t n_more)
{
	msgpack_pack_map(pk, (md ? 8 : 5) + n_more);
	proto_pack_kv_str(pk, "name", m->name);
	proto_pack_kv_str(pk, "path", m->path);
	proto_pack_kv_bool(pk, "loaded", m->e != NULL);
	proto_pack_kv_bool(pk, "default", m == s->default_model);
	proto_pack_kv_str(pk, "device", m->e ? engine_device(m->e) : "");
	if (md != NULL) {
		proto_pack_kv_str(pk, "arch", model_arch_name(md->arch));
		proto_pack_kv_uint(pk, "size", md->weight_bytes);
		proto_pack_kv_str(pk, "format", md->format == MODEL_SAFETENSORS ? "safetensors" : "gguf");
	}
}

void
sched_fill_model_list(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg)
{
	const struct slot *m;
	uint32_t n = 0;

	for (m = s->slots.list; m != NULL; m = m->next)
		n++;
	proto_pack_str(pk, "models");
	msgpack_pack_array(pk, n);
	for (m = s->slots.list; m != NULL; m = m->next)
		pack_model(s, pk, m, m->e ? engine_model(m->e) : NULL, 0);
}

/* A result's `model`: arg is the slot. */
static void
fill_model(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg)
{
	const struct slot *m = arg;

	proto_pack_str(pk, "model");
	pack_model(s, pk, m, m->e ? engine_model(m->e) : NULL, 0);
}

/* model.load: progress before and after the load, then the model. */
void
sched_op_model_load(struct sched *s, struct sched_job *job)
{
	struct slot *m = sched_job_model(s, job, job->req.model);

	if (m == NULL)
		return;
	if (sched_load_now(s, job, m, 1) != 0)
		return;
	sched_post_result(s, job, 1, fill_model, m, strcmp(job->req.model, m->name) != 0 ? m->path : NULL);
}

/* What model.unload did. */
struct unloaded {
	const struct slot *m;
	int was_loaded;
	uint64_t cancelled;     /* requests that were running on it */
};

static void
fill_unloaded(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg)
{
	const struct unloaded *u = arg;

	fill_model(s, job, pk, u->m);
	proto_pack_kv_bool(pk, "unloaded", u->was_loaded);
	proto_pack_kv_uint(pk, "cancelled", u->cancelled);
}

/* model.unload: cancels what runs on it, drops its sessions' caches. */
void
sched_op_model_unload(struct sched *s, struct sched_job *job)
{
	struct slot *m = sched_job_model(s, job, job->req.model);
	struct unloaded u = { m, m != NULL && m->e != NULL, 0 };

	if (m == NULL)
		return;
	u.cancelled = sched_unload_model(s, m, FINISH_CANCEL, NULL);
	sched_post_result(s, job, 3, fill_unloaded, &u, NULL);
}

/* A model.show of a slot, and the engine to describe it with (its own, or a prepared one). */
struct shown {
	const struct slot *m;
	const struct engine *e;
};

/* A model's tensor types: {type, tensors, bytes}, most bytes first. */
static void
pack_tensor_types(msgpack_packer *pk, const struct model_desc *md)
{
	struct model_type_use *uses;
	size_t i, n = model_tensor_types(md, &uses);

	proto_pack_str(pk, "tensor_types");
	msgpack_pack_array(pk, (uint32_t)n);
	for (i = 0; i < n; i++) {
		msgpack_pack_map(pk, 3);
		proto_pack_kv_str(pk, "type", uses[i].name);
		proto_pack_kv_uint(pk, "tensors", uses[i].tensors);
		proto_pack_kv_uint(pk, "bytes", uses[i].bytes);
	}
	free(uses);
}

/* An embedding model's pooling as model.show names it ("": not an embedding model). */
static const char *const pool_names[] = {
	[POOL_NONE] = "", [POOL_MEAN] = "mean", [POOL_CLS] = "cls", [POOL_LAST] = "last",
};

/* model.show's `model`: the model map and what its description says. */
static void
fill_shown(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg)
{
	const struct shown *sh = arg;
	const struct model_desc *md = engine_model(sh->e);
	const struct model_hparams *hp = &md->hp;
	uint64_t need, whole, want, host_bytes = 0;
	int32_t host_layers = sh->m->e != NULL ? engine_host_layers(sh->m->e, &host_bytes) : 0;
	int64_t moves;
	int hot = sh->m->e != NULL ? engine_hot_experts(sh->m->e, &moves) : 0;

	engine_mem_need(sh->e, &need, &whole, &want);
	proto_pack_str(pk, "model");
	pack_model(s, pk, sh->m, md, 24);
	proto_pack_kv_uint(pk, "parameters", model_n_params(md));
	proto_pack_kv_str(pk, "quantization", model_quantization(md));
	pack_tensor_types(pk, md);
	proto_pack_kv_uint(pk, "context", (uint64_t)engine_n_ctx(sh->e));
	proto_pack_kv_uint(pk, "context_train", (uint64_t)hp->n_ctx_train);
	proto_pack_kv_str(pk, "template", chat_tmpl_name(md->chat));
	proto_pack_kv_str(pk, "template_error", md->chat_error ? md->chat_error : "");
	proto_pack_kv_uint(pk, "vocab", (uint64_t)hp->n_vocab);
	proto_pack_kv_uint(pk, "layers", (uint64_t)hp->n_layer);
	proto_pack_kv_uint(pk, "embedding", (uint64_t)hp->n_embd);
	proto_pack_kv_uint(pk, "heads", (uint64_t)hp->n_head);
	proto_pack_kv_uint(pk, "kv_heads", (uint64_t)hp->n_head_kv);
	proto_pack_kv_uint(pk, "head_dim", (uint64_t)hp->head_dim);
	proto_pack_kv_uint(pk, "feed_forward", (uint64_t)hp->n_ff);
	proto_pack_kv_uint(pk, "sliding_window", (uint64_t)hp->sliding_window);
	proto_pack_kv_uint(pk, "memory_bytes", sh->m->e ? engine_mem_bytes(sh->m->e) : 0);
	proto_pack_kv_uint(pk, "need_bytes", need);
	proto_pack_kv_uint(pk, "whole_bytes", whole);
	proto_pack_kv_uint(pk, "host_layers", (uint64_t)host_layers);
	proto_pack_kv_uint(pk, "host_bytes", host_bytes);
	proto_pack_kv_uint(pk, "hot_experts", (uint64_t)hot);
	proto_pack_kv_str(pk, "pooling", pool_names[md->embed.pool]);
	proto_pack_kv_uint(pk, "dimensions", md->embed.pool != POOL_NONE ? (uint64_t)md->embed.n_out : 0);
	proto_pack_kv_bool(pk, "bidirectional", md->embed.bidirectional);
}

/*
 * model.show: a model's description, from its engine when it is loaded,
 * else from its file, opened without loading the weights (a model_open:
 * 70 ms for Gemma 3 270M's 262,144-token vocabulary, as slots_load's own).
 */
void
sched_op_model_show(struct sched *s, struct sched_job *job)
{
	char err[ERR_LEN];
	struct slot *m = sched_job_model(s, job, job->req.model);
	struct engine *e = NULL;
	struct shown sh;

	if (m == NULL)
		return;
	if (m->e == NULL && slots_prepare(&s->slots, m, &e, err) != 0) {
		sched_post_error(s, job, PE_MODEL_ERROR, err);
		return;
	}
	sh.m = m;
	sh.e = m->e ? m->e : e;
	sched_post_result(s, job, 1, fill_shown, &sh, NULL);
	if (e != NULL)
		engine_close(e);
}

/* status.kv: the KV bytes in each tier. */
static void
pack_kv_tiers(struct sched *s, msgpack_packer *pk, uint64_t device_bytes)
{
	uint64_t disk = 0, disk_budget = 0;

	if (s->disk != NULL)
		kvdisk_usage(s->disk, &disk, &disk_budget);
	proto_pack_str(pk, "kv");
	msgpack_pack_map(pk, 5);
	proto_pack_kv_uint(pk, "device_bytes", device_bytes);
	proto_pack_kv_uint(pk, "host_bytes", s->host.used);
	proto_pack_kv_uint(pk, "host_budget_bytes", s->host.budget);
	proto_pack_kv_uint(pk, "disk_bytes", disk);
	proto_pack_kv_uint(pk, "disk_budget_bytes", disk_budget);
}

/* A histogram as status has it: {bounds, counts, sum}, in the spec's unit (seconds for times). */
static void
pack_hist(msgpack_packer *pk, const char *key, const struct hist *h, const struct hist_spec *spec)
{
	int i;

	proto_pack_str(pk, key);
	msgpack_pack_map(pk, 3);
	proto_pack_str(pk, "bounds");
	msgpack_pack_array(pk, (uint32_t)spec->n);
	for (i = 0; i < spec->n; i++)
		msgpack_pack_double(pk, (double)spec->le[i] / spec->unit);
	proto_pack_str(pk, "counts");
	msgpack_pack_array(pk, (uint32_t)spec->n + 1);
	for (i = 0; i <= spec->n; i++)
		msgpack_pack_uint64(pk, h->count[i]);
	proto_pack_kv_float(pk, "sum", (double)h->sum / spec->unit);
}

/* status.requests: the generate requests ended since the start, by how. */
static void
pack_requests(struct sched *s, msgpack_packer *pk)
{
	enum finish_reason f;

	proto_pack_str(pk, "requests");
	msgpack_pack_map(pk, FINISH_ERROR - FINISH_STOP + 1);
	for (f = FINISH_STOP; f <= FINISH_ERROR; f++)
		proto_pack_kv_uint(pk, engine_finish_name(f), s->requests[f]);
}

/*
 * Whether a request is for model m: the one it runs on, or for a queued
 * request, the one it names (a name or a path; none: the default model).
 */
static int
gen_is_for(const struct sched *s, const struct gen *g, const struct slot *m)
{
	const char *want;

	if (g->slot != NULL)
		return g->slot == m;
	want = g->job->req.model ? g->job->req.model : g->job->session_model;
	if (want == NULL)
		return m == s->default_model;
	return strcmp(want, m->name) == 0 || strcmp(want, m->path) == 0;
}

void
sched_fill_status(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg)
{
	const struct slot *m;
	const struct gen *g;
	uint32_t n_models = 0, active = 0, queued = 0, ma, mq;
	struct engine_cache_stats cs;
	uint64_t device_bytes = 0, host_bytes = 0, drafted = 0, accepted = 0;
	int32_t host_layers;
	int64_t moves = 0;
	int hot, i;

	for (m = s->slots.list; m != NULL; m = m->next)
		n_models++;
	for (g = s->gens; g != NULL; g = g->next)
		g->state != GEN_QUEUED ? active++ : queued++;
	proto_pack_kv_uint(pk, "version", PROTO_VERSION);
	proto_pack_kv_float(pk, "uptime_s", (double)(now_ns() - s->t_start) / 1e9);
	proto_pack_kv_uint(pk, "active", active);
	proto_pack_kv_uint(pk, "queued", queued);
	pack_requests(s, pk);
	proto_pack_str(pk, "models");
	msgpack_pack_array(pk, n_models);
	for (m = s->slots.list; m != NULL; m = m->next) {
		for (ma = mq = 0, g = s->gens; g != NULL; g = g->next)
			if (gen_is_for(s, g, m))
				g->state != GEN_QUEUED ? ma++ : mq++;
		memset(&cs, 0, sizeof cs);
		if (m->e != NULL)
			engine_cache_stats(m->e, &cs);
		host_layers = m->e != NULL ? engine_host_layers(m->e, &host_bytes) : 0;
		hot = m->e != NULL ? engine_hot_experts(m->e, &moves) : 0;
		if (m->e != NULL)
			engine_spec_stats(m->e, &drafted, &accepted);
		msgpack_pack_map(pk, 32);
		proto_pack_kv_str(pk, "name", m->name);
		proto_pack_kv_bool(pk, "loaded", m->e != NULL);
		proto_pack_kv_uint(pk, "faults", m->faults);
		proto_pack_kv_uint(pk, "memory_bytes", m->e ? engine_mem_bytes(m->e) : 0);
		proto_pack_kv_float(pk, "keep_alive_s", m->keep_alive);
		proto_pack_kv_float(pk, "expires_in_s", slots_expires_in(m));
		proto_pack_kv_uint(pk, "loads", m->loads);
		proto_pack_kv_uint(pk, "unloads", m->unloads);
		proto_pack_kv_str(pk, "device", m->e ? engine_device(m->e) : "");
		proto_pack_kv_bool(pk, "exact", m->e != NULL && engine_exact(m->e));
		proto_pack_kv_uint(pk, "weights_bytes", m->e ? engine_model(m->e)->weight_bytes : 0);
		proto_pack_kv_uint(pk, "host_layers", (uint64_t)host_layers);
		proto_pack_kv_uint(pk, "host_bytes", m->e ? host_bytes : 0);
		proto_pack_kv_uint(pk, "hot_experts", (uint64_t)hot);
		proto_pack_kv_uint(pk, "expert_moves", (uint64_t)moves);
		proto_pack_kv_str(pk, "kv_type", m->e ? kv_type_name(s->o.kv_type) : "");
		proto_pack_kv_uint(pk, "kv_bytes", m->e ? engine_kv_bytes(m->e) : 0);
		proto_pack_kv_uint(pk, "kv_blocks", m->e ? (uint64_t)engine_kv_blocks(m->e) : 0);
		proto_pack_kv_uint(pk, "kv_free_blocks", m->e ? (uint64_t)engine_free_blocks(m->e) : 0);
		proto_pack_kv_uint(pk, "active", ma);
		proto_pack_kv_uint(pk, "queued", mq);
		proto_pack_kv_uint(pk, "cache_hit_tokens", cs.hit);
		proto_pack_kv_uint(pk, "cache_miss_tokens", cs.miss);
		proto_pack_kv_uint(pk, "cache_host_hit_tokens", cs.host_hit);
		proto_pack_kv_uint(pk, "cache_disk_hit_tokens", cs.disk_hit);
		proto_pack_kv_uint(pk, "kv_used_bytes", cs.used_bytes);
		proto_pack_kv_uint(pk, "prompt_tokens", m->prompt_tokens);
		proto_pack_kv_uint(pk, "generated_tokens", m->generated_tokens);
		proto_pack_kv_uint(pk, "drafted_tokens", m->e ? drafted : 0);
		proto_pack_kv_uint(pk, "accepted_tokens", m->e ? accepted : 0);
		pack_hist(pk, "ttft", &m->ttft, &hist_ttft);
		pack_hist(pk, "itl", &m->itl, &hist_itl);
		device_bytes += cs.used_bytes;
	}
	pack_kv_tiers(s, pk, device_bytes);
	proto_pack_str(pk, "memory");
	msgpack_pack_map(pk, 4);
	proto_pack_kv_uint(pk, "budget_bytes", s->slots.o.budget);
	proto_pack_kv_uint(pk, "used_bytes", s->slots.used);
	proto_pack_kv_uint(pk, "loads", s->slots.loads);
	proto_pack_kv_uint(pk, "unloads", s->slots.unloads);
	proto_pack_str(pk, "clients");
	msgpack_pack_array(pk, (uint32_t)job->n_clients);
	for (i = 0; i < job->n_clients; i++) {
		msgpack_pack_map(pk, 4);
		proto_pack_kv_uint(pk, "pid", (uint64_t)job->clients[i].pid);
		proto_pack_kv_uint(pk, "uid", job->clients[i].uid);
		proto_pack_kv_str(pk, "client", job->clients[i].client);
		proto_pack_kv_uint(pk, "requests", (uint64_t)job->clients[i].requests);
	}
	proto_pack_str(pk, "steps");
	msgpack_pack_map(pk, 5);
	proto_pack_kv_uint(pk, "count", s->steps);
	proto_pack_kv_uint(pk, "tokens", s->step_tokens);
	proto_pack_kv_uint(pk, "max_batch", (uint64_t)s->max_batch);
	proto_pack_kv_float(pk, "mean_batch", s->steps ? (double)s->step_seqs / (double)s->steps : 0);
	pack_hist(pk, "batch", &s->batch, &hist_batch);
}
