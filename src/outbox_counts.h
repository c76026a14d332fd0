/*-------------------------------------------------------------------------
 *
 * outbox_counts.h
 *	  The outbox's acked counts in shared memory (outbox_counts.c): ack()
 *	  counts, the purge (lifecycle.c) takes, owners.c frees.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_COUNTS_H
#define OUTBOX_COUNTS_H

extern void idem_outbox_counts_init(void);
extern void idem_outbox_count_acked(Oid gen, int32 topic_id, Oid owner,
									int64 delivered, int64 retried);
extern int	idem_outbox_counts_take(Oid owner, int32 *topic_ids, int64 *delivered,
									int64 *retried, int max);
extern void idem_outbox_counts_put_back(int32 topic_id, int64 delivered, int64 retried);
extern void idem_outbox_counts_forget(Oid db, Oid gen);
extern int	idem_outbox_counts_databases(Oid *dbs, int max);

#endif							/* OUTBOX_COUNTS_H */
