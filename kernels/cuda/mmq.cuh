/*
 * mmq.cuh: the integer matrix-vector kernels' arithmetic per weight type
 * (matmul.cu's mmq_block runs it): qt<TY> reads a chunk of a row and
 * decodes it to integers and scales, reads the same chunk of the int8
 * form of x (cuda_q8) from global memory or from a block's copy of it in
 * shared memory (mmq_stage_x), and dots the two with dp4a.
 */
#ifndef RESIDENT_CUDA_MMQ_CUH
#define RESIDENT_CUDA_MMQ_CUH

#include "dequant.cuh"
#include "norm.cuh"
#include "tc.cuh"

/* N little-endian words from a 2-byte aligned address: N + 1 aligned loads, funnel-shifted. */
template <int N>
static __device__ __forceinline__ void
words_a2(const uint8_t *p, uint32_t *o)
{
	const uint32_t *w = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
	int sh = (int)((uintptr_t)p & 3) * 8;
	uint32_t prev = __ldg(w);

#pragma unroll
	for (int i = 0; i < N; i++) {
		uint32_t next = i + 1 < N || sh ? __ldg(w + i + 1) : 0u; /* never past an aligned end */

		o[i] = __funnelshift_r(prev, next, sh);
		prev = next;
	}
}

/* hi . w and lo . w as one integer: QLO * (hi . w) + lo . w, for 4 x 4 bytes at a time. */
static __device__ __forceinline__ int
dot2(const int *w, const uint4 *hi, const uint4 *lo, int n4)
{
	int sh = 0, sl = 0;

#pragma unroll
	for (int i = 0; i < n4; i++) {
		const uint4 a = hi[i / 4], b = lo[i / 4];
		const uint32_t ha[4] = { a.x, a.y, a.z, a.w }, lb[4] = { b.x, b.y, b.z, b.w };

		sh = __dp4a(w[i], (int)ha[i % 4], sh);
		sl = __dp4a(w[i], (int)lb[i % 4], sl);
	}
	return QLO * sh + sl;
}

/*
 * A block's copy of one token's int8 form in shared memory (XS kernels):
 * the hi and lo rows in 16-byte units, unit u stored at mmq_xs_unit(u),
 * then the scales (cuda_q8.d) as they are. The slots of Q4_K rows in
 * runs of lanes (qwen3-30b-a3b's experts) read x from it: there every run
 * of a warp read x again, a chunk of 64 elements a lane at a stride of 64
 * bytes (32 sectors a 16-byte load, half of each used), twice the bytes
 * of the weights it was multiplied with. The swizzle spreads 8 lanes
 * reading piece i of chunks c .. c + 7 over distinct banks. The dense
 * one-token products (one row a whole warp) halved their L1 throughput
 * the same way but ran 1-5 % slower (ncu, H200, tests/bench/RESULTS.md):
 * the copy delays the first weight loads, and asking for them before it
 * held their decoded values across the barrier (twice the registers).
 */
static __device__ __forceinline__ int
mmq_xs_unit(int u)
{
	return u ^ ((u >> 3) & 3);
}

/* 16-byte units of one token's copy (k wide): hi, lo, the scales. */
static __host__ __device__ __forceinline__ int
mmq_xs_units(int k)
{
	return k / 8 + k / 64;
}

/* Whether the integer kernel of type TY in runs of LS lanes reads x from the block's copy. */
template <int TY, int LS>
constexpr bool mmq_xs = TY == TT_Q4_K && LS < WARP; /* rows of 256 to 2,048: a copy of at most 4.5 KB */

/* The dynamic shared memory of that kernel's block for rows of k. */
template <int TY, int LS>
static size_t
mmq_xs_bytes(int k)
{
	return mmq_xs<TY, LS> ? (size_t)mmq_xs_units(k) * 16 : 0;
}

/* One token's int8 form from xq, xd into xs by the whole block; every thread waits for it. */
static __device__ __forceinline__ void
mmq_stage_x(uint4 *xs, const int8_t *__restrict__ xq, const float2 *__restrict__ xd, int k)
{
	uint32_t sa = (uint32_t)__cvta_generic_to_shared(xs);
	int nq = k / 8;

	for (int u = threadIdx.x; u < mmq_xs_units(k); u += blockDim.x)
		cp_async16_at(sa + 16 * (u < nq ? mmq_xs_unit(u) : u),
		    u < nq ? (const void *)(xq + 16 * u) : (const void *)(xd + 2 * (u - nq)));
	cp_async_commit();
	cp_async_wait<0>();
	__syncthreads();
}

/*
 * A type's integer kernel, a chunk of n elements at a time: load() reads
 * chunk c of a row and decodes it to integers and scales (W), loadx() reads
 * the same chunk of token t's activations (X), loadxs() (Q4_K) from the
 * block's copy, dot() is their product.
 */
template <int TY> struct qt;

/* Q4_K, a pair of sub-blocks: the low nibbles of 32 bytes are the first, the high ones the second. */
template <> struct qt<TT_Q4_K> {
	static constexpr int n = 64;
	struct W {
		int w0[8], w1[8];
		float a0, a1, m0, m1;  /* d * scale and dmin * min of the two */
	};
	struct X {
		uint4 h[4], l[4];
		float2 d0, d1;
	};
	static __device__ __forceinline__ void
	load(const uint8_t *__restrict__ row, int c, W &o)
	{
		const uint8_t *b = row + (size_t)(c >> 2) * 144;
		int p = c & 3, sh = 16 * (p & 1);
		/* the block's d, dmin and scales in one load: byte loads of the scales were most of the loads */
		uint4 hd = __ldg((const uint4 *)b);
		uint4 qa = __ldg((const uint4 *)(b + 16 + 32 * p)), qb = __ldg((const uint4 *)(b + 32 + 32 * p));
		const uint32_t qw[8] = { qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w };
		float d = __half2float(__ushort_as_half((unsigned short)(hd.x & 0xffff)));
		float dmin = __half2float(__ushort_as_half((unsigned short)(hd.x >> 16)));
		uint32_t sc[2], mn[2], s2, m2;

		k4_unpack(hd.y, hd.z, hd.w, sc, mn);
		s2 = (p < 2 ? sc[0] : sc[1]) >> sh, m2 = (p < 2 ? mn[0] : mn[1]) >> sh;
		o.a0 = d * (float)(s2 & 0xff), o.a1 = d * (float)((s2 >> 8) & 0xff);
		o.m0 = dmin * (float)(m2 & 0xff), o.m1 = dmin * (float)((m2 >> 8) & 0xff);
#pragma unroll
		for (int i = 0; i < 8; i++) {
			o.w0[i] = (int)(qw[i] & 0x0f0f0f0fu);
			o.w1[i] = (int)((qw[i] >> 4) & 0x0f0f0f0fu);
		}
	}
	static __device__ __forceinline__ void
	loadx(const int8_t *__restrict__ xq, const float2 *__restrict__ xd, int k, int t, int c, X &x)
	{
		const uint4 *xh = (const uint4 *)(xq + (size_t)t * 2 * k + 64 * c), *xl = xh + k / 16;

#pragma unroll
		for (int i = 0; i < 4; i++)
			x.h[i] = __ldg(xh + i), x.l[i] = __ldg(xl + i);
		x.d0 = __ldg(xd + (size_t)t * (k / 32) + 2 * c);
		x.d1 = __ldg(xd + (size_t)t * (k / 32) + 2 * c + 1);
	}
	static __device__ __forceinline__ void
	loadxs(const uint4 *xs, int k, int c, X &x)
	{
		int sh = (c >> 1) & 3, lo = k / 16 + 4 * c, sl = (lo >> 3) & 3;
		float4 d = ((const float4 *)xs)[k / 8 + c];

#pragma unroll
		for (int i = 0; i < 4; i++)
			x.h[i] = xs[4 * c + (i ^ sh)], x.l[i] = xs[lo + (i ^ sl)];
		x.d0 = make_float2(d.x, d.y), x.d1 = make_float2(d.z, d.w);
	}
	static __device__ __forceinline__ float
	dot(const W &w, const X &x)
	{
		return w.a0 * x.d0.x * (float)dot2(w.w0, x.h, x.l, 8) + w.a1 * x.d1.x * (float)dot2(w.w1, x.h + 2, x.l + 2, 8) -
		    (w.m0 * x.d0.y + w.m1 * x.d1.y);
	}
};

/*
 * Q6_K (regrouped at load, TT_Q6_KG), eight positions l0 .. l0 + 7 of one
 * half of a block in each of its four quarters (32 elements): the quarters
 * share their ql and qh bytes. Four aligned 8-byte loads (three of quants,
 * one of the half's scales) and the group's d, where the file's layout took
 * 2-byte loads and funnel shifts. Chunks of 64 elements (16-byte loads)
 * held 146 registers at one token and 199 at two, against 87 and 116, and
 * two tokens ran 4 % slower (H100, tests/bench/RESULTS.md).
 */
template <> struct qt<TT_Q6_KG> {
	static constexpr int n = 32;
	struct W {
		int v[4][2];
		float sc[4];
	};
	struct X {
		uint2 h[4], l[4];
		float d[4];
	};
	static __device__ __forceinline__ void
	load(const uint8_t *__restrict__ row, int c, W &o)
	{
		const uint8_t *b = q6g_body(row, c >> 3);
		int h = (c >> 2) & 1, l0 = (c & 3) * 8;
		uint2 qa = __ldg((const uint2 *)(b + 64 * h + l0)), qb = __ldg((const uint2 *)(b + 64 * h + 32 + l0));
		uint2 qc = __ldg((const uint2 *)(b + 128 + 32 * h + l0));
		uint2 sw = __ldg((const uint2 *)(b + 192 + 8 * h));
		const uint32_t la[2] = { qa.x, qa.y }, lb[2] = { qb.x, qb.y }, qh[2] = { qc.x, qc.y };
		float d = q6g_d(row, c >> 3);

#pragma unroll
		for (int s = 0; s < 4; s++) {
			uint32_t w = s < 2 ? sw.x : sw.y;

			o.sc[s] = d * (float)(int8_t)(w >> (8 * (2 * (s & 1) + (l0 >> 4))));
#pragma unroll
			for (int i = 0; i < 2; i++) {
				uint32_t lo = ((s & 1 ? lb[i] : la[i]) >> (4 * (s >> 1))) & 0x0f0f0f0fu;
				uint32_t hi = (qh[i] >> (2 * s)) & 0x03030303u;

				/* 0..63 less 32 never saturates: __vsub4 is 3 instructions, __vsubss4 8 */
				o.v[s][i] = (int)__vsub4(lo | hi << 4, 0x20202020u);
			}
		}
	}
	static __device__ __forceinline__ void
	loadx(const int8_t *__restrict__ xq, const float2 *__restrict__ xd, int k, int t, int c, X &x)
	{
		int e0 = (c >> 3) * 256 + ((c >> 2) & 1) * 128 + (c & 3) * 8;
		const int8_t *xt = xq + (size_t)t * 2 * k + e0;

#pragma unroll
		for (int s = 0; s < 4; s++) {
			x.h[s] = __ldg((const uint2 *)(xt + 32 * s));
			x.l[s] = __ldg((const uint2 *)(xt + k + 32 * s));
			x.d[s] = __ldg(&xd[(size_t)t * (k / 32) + e0 / 32 + s].x);
		}
	}
	static __device__ __forceinline__ float
	dot(const W &w, const X &x)
	{
		float r = 0.0f;

#pragma unroll
		for (int s = 0; s < 4; s++) {
			int sh = __dp4a(w.v[s][1], (int)x.h[s].y, __dp4a(w.v[s][0], (int)x.h[s].x, 0));
			int sl = __dp4a(w.v[s][1], (int)x.l[s].y, __dp4a(w.v[s][0], (int)x.l[s].x, 0));

			r += w.sc[s] * x.d[s] * (float)(QLO * sh + sl);
		}
		return r;
	}
};

/* Q8_0: one block, d * q. */
template <> struct qt<TT_Q8_0> {
	static constexpr int n = 32;
	struct W {
		int q[8];
		float d;
	};
	struct X {
		uint4 h[2], l[2];
		float d;
	};
	static __device__ __forceinline__ void
	load(const uint8_t *__restrict__ row, int c, W &o)
	{
		const uint8_t *b = row + (size_t)c * 34;

		o.d = f16_at(b);
		words_a2<8>(b + 2, (uint32_t *)o.q);
	}
	static __device__ __forceinline__ void
	loadx(const int8_t *__restrict__ xq, const float2 *__restrict__ xd, int k, int t, int c, X &x)
	{
		const uint4 *xh = (const uint4 *)(xq + (size_t)t * 2 * k + 32 * c), *xl = xh + k / 16;

		x.h[0] = __ldg(xh), x.h[1] = __ldg(xh + 1), x.l[0] = __ldg(xl), x.l[1] = __ldg(xl + 1);
		x.d = __ldg(&xd[(size_t)t * (k / 32) + c].x);
	}
	static __device__ __forceinline__ float
	dot(const W &w, const X &x)
	{
		return w.d * x.d * (float)dot2(w.q, x.h, x.l, 8);
	}
};

/*
 * MXFP4G: one block, the doubled e2m1 values as int8 (dp4a takes them),
 * times its halved scale. A word of codes is left in its nibble order
 * (mx4_codes8: elements 4i, 16 + 4i, 4i + 1, 17 + 4i, then 4i + 2, ...)
 * and x's chunk is put in that order once for all of a warp's rows: 16
 * permutes a chunk (x's hi and lo rows) where sorting the codes took 8 a
 * row.
 */
template <> struct qt<TT_MXFP4G> {
	static constexpr int n = 32;
	struct W {
		int q[8];
		float d;
	};
	using X = qt<TT_Q8_0>::X;
	static __device__ __forceinline__ void
	load(const uint8_t *__restrict__ row, int c, W &o)
	{
		uint4 qs = __ldg((const uint4 *)mx4g_qs(row, c));
		const uint32_t w[4] = { qs.x, qs.y, qs.z, qs.w };

		o.d = mx4g_d(row, c);
#pragma unroll
		for (int i = 0; i < 4; i++) {
			uint2 v = mx4_codes8(w[i]);

			o.q[2 * i] = (int)v.x;
			o.q[2 * i + 1] = (int)v.y;
		}
	}
	/* 32 int8 of x (words 0-7 in v) in mx4_codes8's order */
	static __device__ __forceinline__ void
	nibble_order(uint4 (&v)[2])
	{
		const uint32_t a[4] = { v[0].x, v[0].y, v[0].z, v[0].w }, b[4] = { v[1].x, v[1].y, v[1].z, v[1].w };
		uint32_t o[8];

#pragma unroll
		for (int i = 0; i < 4; i++)
			o[2 * i] = prmt(a[i], b[i], 0x5140), o[2 * i + 1] = prmt(a[i], b[i], 0x7362);
		v[0] = make_uint4(o[0], o[1], o[2], o[3]);
		v[1] = make_uint4(o[4], o[5], o[6], o[7]);
	}
	static __device__ __forceinline__ void
	loadx(const int8_t *__restrict__ xq, const float2 *__restrict__ xd, int k, int t, int c, X &x)
	{
		qt<TT_Q8_0>::loadx(xq, xd, k, t, c, x);
		nibble_order(x.h);
		nibble_order(x.l);
	}
	static __device__ __forceinline__ float
	dot(const W &w, const X &x)
	{
		return w.d * x.d * (float)dot2(w.q, x.h, x.l, 8);
	}
};

#endif
