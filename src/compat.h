/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  Every difference between the PostgreSQL versions the extension builds
 *	  against (13 to 17), in one place.  The .c files use the names below
 *	  and never test PG_VERSION_NUM themselves.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_COMPAT_H
#define IDEMPOTENCY_COMPAT_H

#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "utils/tuplestore.h"
#include "storage/proc.h"
#include "utils/guc.h"

#if PG_VERSION_NUM >= 140000
#include "common/cryptohash.h"
#endif
#include "common/sha2.h"

#if PG_VERSION_NUM >= 160000
#include "parser/parse_relation.h"
#endif
#if PG_VERSION_NUM >= 170000
#include "storage/procnumber.h"
#else
#include "storage/sinvaladt.h"
#endif

/* ---------------------------------------------------------------------
 * sha256: pg_cryptohash since 14 (final() takes the length since 15)
 * ---------------------------------------------------------------------
 */
typedef struct IdemSha256
{
#if PG_VERSION_NUM >= 140000
	pg_cryptohash_ctx *ctx;
#else
	pg_sha256_ctx ctx;
#endif
} IdemSha256;

static inline void
idem_sha256_init(IdemSha256 *st)
{
#if PG_VERSION_NUM >= 140000
	st->ctx = pg_cryptohash_create(PG_SHA256);
	if (pg_cryptohash_init(st->ctx) < 0)
		elog(ERROR, "could not initialize sha256 context");
#else
	pg_sha256_init(&st->ctx);
#endif
}

static inline void
idem_sha256_update(IdemSha256 *st, const void *data, size_t len)
{
#if PG_VERSION_NUM >= 140000
	if (pg_cryptohash_update(st->ctx, (const uint8 *) data, len) < 0)
		elog(ERROR, "could not update sha256 context");
#else
	pg_sha256_update(&st->ctx, (const uint8 *) data, len);
#endif
}

/* out has PG_SHA256_DIGEST_LENGTH (32) bytes */
static inline void
idem_sha256_final(IdemSha256 *st, uint8 *out)
{
#if PG_VERSION_NUM >= 150000
	if (pg_cryptohash_final(st->ctx, out, PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "could not finalize sha256 context");
	pg_cryptohash_free(st->ctx);
#elif PG_VERSION_NUM >= 140000
	if (pg_cryptohash_final(st->ctx, out) < 0)
		elog(ERROR, "could not finalize sha256 context");
	pg_cryptohash_free(st->ctx);
#else
	pg_sha256_final(&st->ctx, out);
#endif
}

/* ---------------------------------------------------------------------
 * the PGPROC of a virtual transaction's backend (ProcNumber since 17)
 * ---------------------------------------------------------------------
 */
#if PG_VERSION_NUM >= 170000
#define IDEM_VXID_PROC(vxid) ProcNumberGetProc((vxid).procNumber)
#else
#define IDEM_VXID_PROC(vxid) BackendIdGetProc((vxid).backendId)
#endif

/* ---------------------------------------------------------------------
 * this backend's local transaction id (inside vxid since 17)
 * ---------------------------------------------------------------------
 */
#if PG_VERSION_NUM >= 170000
#define IDEM_MY_LXID (MyProc->vxid.lxid)
#else
#define IDEM_MY_LXID (MyProc->lxid)
#endif

/* ---------------------------------------------------------------------
 * executor: the range table takes permission infos since 16
 * ---------------------------------------------------------------------
 */
#if PG_VERSION_NUM >= 160000
#define IDEM_INIT_RANGE_TABLE(estate, rte) \
	do { \
		List	   *perminfos_ = NIL; \
		addRTEPermissionInfo(&perminfos_, (rte)); \
		ExecInitRangeTable((estate), list_make1(rte), perminfos_); \
	} while (0)
#else
#define IDEM_INIT_RANGE_TABLE(estate, rte) \
	ExecInitRangeTable((estate), list_make1(rte))
#endif

/* MERGE exists since 15 */
#if PG_VERSION_NUM >= 150000
#define IDEM_IS_MERGE_TAG(tag) ((tag) == T_MergeStmt)
#else
#define IDEM_IS_MERGE_TAG(tag) false
#endif

/* parse analysis takes a query environment since 15 */
#if PG_VERSION_NUM >= 150000
#define IDEM_PARSE_ANALYZE_VARPARAMS(rs, sql, types, ntypes) \
	parse_analyze_varparams((rs), (sql), (types), (ntypes), NULL)
#else
#define IDEM_PARSE_ANALYZE_VARPARAMS(rs, sql, types, ntypes) \
	parse_analyze_varparams((rs), (sql), (types), (ntypes))
#endif

/* the executor's simple-relation insert takes the ResultRelInfo since 14 */
#if PG_VERSION_NUM >= 140000
#define IDEM_SIMPLE_INSERT(rri, estate, slot) \
	ExecSimpleRelationInsert((rri), (estate), (slot))
#else
#define IDEM_SIMPLE_INSERT(rri, estate, slot) \
	do { \
		(estate)->es_result_relation_info = (rri); \
		ExecSimpleRelationInsert((estate), (slot)); \
	} while (0)
#endif

/* ---------------------------------------------------------------------
 * set-returning functions in materialize mode: InitMaterializedSRF since 15
 * ---------------------------------------------------------------------
 */
static inline void
idem_init_materialized_srf(FunctionCallInfo fcinfo)
{
#if PG_VERSION_NUM >= 150000
	InitMaterializedSRF(fcinfo, 0);
#else
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TupleDesc	tupdesc;
	MemoryContext old;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		!(rsinfo->allowedModes & SFRM_Materialize))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("materialize mode required, but it is not allowed in this context")));
	old = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = tuplestore_begin_heap(true, false, work_mem);
	rsinfo->setDesc = CreateTupleDescCopy(tupdesc);
	MemoryContextSwitchTo(old);
#endif
}

/* ---------------------------------------------------------------------
 * GUCs: MarkGUCPrefixReserved since 15
 * ---------------------------------------------------------------------
 */
#if PG_VERSION_NUM >= 150000
#define IDEM_RESERVE_GUC_PREFIX(prefix) MarkGUCPrefixReserved(prefix)
#else
#define IDEM_RESERVE_GUC_PREFIX(prefix) EmitWarningsOnPlaceholders(prefix)
#endif

/* ---------------------------------------------------------------------
 * shared memory of a preloaded library: requested from shmem_request_hook
 * since 15 (which refuses requests made elsewhere), from _PG_init before.
 * idem_request_shmem(fn), called from _PG_init, makes fn request it
 * (RequestAddinShmemSpace, RequestNamedLWLockTranche) at the right time,
 * chaining any previous hook.
 * ---------------------------------------------------------------------
 */
typedef void (*IdemShmemRequestFn) (void);

#if PG_VERSION_NUM >= 150000
#include "miscadmin.h"

static IdemShmemRequestFn idem_shmem_request_fn pg_attribute_unused() = NULL;
static shmem_request_hook_type idem_prev_shmem_request_hook pg_attribute_unused() = NULL;

static inline void
idem_shmem_request_chain(void)
{
	if (idem_prev_shmem_request_hook)
		idem_prev_shmem_request_hook();
	idem_shmem_request_fn();
}

static inline void
idem_request_shmem(IdemShmemRequestFn fn)
{
	idem_shmem_request_fn = fn;
	idem_prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = idem_shmem_request_chain;
}
#else
static inline void
idem_request_shmem(IdemShmemRequestFn fn)
{
	fn();
}
#endif

/* ---------------------------------------------------------------------
 * a database left half-dropped by an interrupted DROP DATABASE (marked by
 * datconnlimit since 15.4, 14.9, 13.12): nobody may connect to it
 * ---------------------------------------------------------------------
 */
#ifdef DATCONNLIMIT_INVALID_DB
#define IDEM_DATABASE_IS_INVALID(form) database_is_invalid_form(form)
#else
#define IDEM_DATABASE_IS_INVALID(form) false
#endif

/* ---------------------------------------------------------------------
 * Encoding conversion that stops at what it cannot convert, and the
 * valid prefix of a string: both since 14 (pg_do_encoding_conversion_buf
 * with noError, pg_encoding_verifymbstr).  13 converts only whole strings
 * and raises on what it cannot: there, keep the ASCII prefix, which every
 * server encoding spells alike.  dest has room for len *
 * MAX_CONVERSION_GROWTH + 1 bytes; both return the bytes of src taken.
 * ---------------------------------------------------------------------
 */
static inline int
idem_ascii_prefix(const char *src, int len, char *dest)
{
	int			n = 0;

	while (n < len && !IS_HIGHBIT_SET(src[n]))
	{
		dest[n] = src[n];
		n++;
	}
	dest[n] = '\0';
	return n;
}

static inline int
idem_convert_prefix(Oid proc, int src_encoding, int dest_encoding,
					const char *src, int len, char *dest)
{
#if PG_VERSION_NUM >= 140000
	return pg_do_encoding_conversion_buf(proc, src_encoding, dest_encoding,
										 (unsigned char *) src, len,
										 (unsigned char *) dest,
										 len * MAX_CONVERSION_GROWTH + 1, true);
#else
	return idem_ascii_prefix(src, len, dest);
#endif
}

static inline int
idem_valid_prefix(int encoding, const char *src, int len, char *dest)
{
#if PG_VERSION_NUM >= 140000
	int			n = pg_encoding_verifymbstr(encoding, src, len);

	memcpy(dest, src, n);
	dest[n] = '\0';
	return n;
#else
	return idem_ascii_prefix(src, len, dest);
#endif
}

#endif							/* IDEMPOTENCY_COMPAT_H */
