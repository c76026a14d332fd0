/*-------------------------------------------------------------------------
 *
 * outbox_claims.h
 *	  Where an outbox claim lives (outbox_claims.c): claims in shared
 *	  memory (preloaded) and claim()'s work with them, for outbox_relay.c;
 *	  the install the entries belong to, for outbox_counts.c and owners.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_CLAIMS_H
#define OUTBOX_CLAIMS_H

#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "nodes/execnodes.h"
#include "utils/builtins.h"
#include "utils/syscache.h"
#include "utils/uuid.h"

/* preloaded: the claims' table is in shared memory */
extern bool idem_outbox_claims_on;

extern void idem_outbox_claims_init(void);
extern Oid	idem_outbox_install(void);

/*
 * One claim() call's share of the table: the topic's owner, and how many
 * live claims that role's topics hold, counted once half the table is in
 * use (-1 until then; made: the claims made in the whole table when
 * counted, and by this call since; counted: how many times).  Then a role
 * that holds an eighth of the table enters no more claims, so that one
 * role cannot fill it for every other.  A superuser's topics are not
 * limited (limited false): a superuser is no tenant to keep from the
 * others.
 */
typedef struct IdemClaimShare
{
	Oid			owner;
	bool		limited;
	int			held;
	int			counted;
	uint64		made;
} IdemClaimShare;

extern int32 idem_outbox_claim_scan(Datum *values, int32 want,
									ReturnSetInfo *rsinfo, bool *full,
									IdemClaimShare *share);
extern int32 idem_outbox_claim_run_shared(SPIPlanPtr *plan, const char *sql,
										  Oid *argtypes, Datum *values,
										  int32 remaining,
										  ReturnSetInfo *rsinfo,
										  IdemClaimShare *share);
extern int64 idem_outbox_claims_end(const pg_uuid_t *token, int n,
									const int64 *ids, const int32 *attempts,
									const bool *durable, bool ack, Oid *gen);
extern bool idem_outbox_topic_visible(int32 topic_id);
extern void idem_outbox_claims_forget(Oid db, Oid gen);
extern void idem_outbox_claims_forget_topic(Oid db, Oid gen, int32 topic_id);
extern int	idem_outbox_claims_databases(Oid *dbs, int max);

/*
 * Are this database's claims in shared memory?  The library preloaded,
 * and the extension's SQL objects of 0.6.0 or later, which read them
 * (idempotency._outbox_attempt(int8, uuid)); else claim() writes them into
 * the rows.  Looked up at each call (a syscache probe): the update's commit
 * changes the answer for every session.
 */
static inline bool
idem_outbox_claims_shared(void)
{
	Oid			nsp;
	Oid			args[2] = {INT8OID, UUIDOID};

	if (!idem_outbox_claims_on)
		return false;
	nsp = get_namespace_oid("idempotency", true);
	return OidIsValid(nsp) &&
		OidIsValid(GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid,
								   CStringGetDatum("_outbox_attempt"),
								   PointerGetDatum(buildoidvector(args, 2)),
								   ObjectIdGetDatum(nsp)));
}

#endif							/* OUTBOX_CLAIMS_H */
