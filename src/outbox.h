/*-------------------------------------------------------------------------
 *
 * outbox.h
 *	  Declarations shared by the files of the outbox (features floor):
 *
 *	  outbox_publish.c  publish(): the hot path, the message id
 *	  outbox_relay.c    claim(), ack(), nack(), release(), redrive()
 *	  outbox_window.c   claim() with claims in shared memory: the window
 *	                    scanned in C, what a claim does with a locked row
 *	  outbox_topics.c   create/alter/drop_topic(), grant/revoke_topic()
 *	  outbox_notify.c   NOTIFY at commit, for topics created with notify => true
 *	  outbox.c          what they share: argument checks, a topic and the
 *	                    caller's rights (lookup, lock, the publish()
 *	                    cache), a message key's lock; the outbox's design
 *
 * outbox_relay.c uses outbox_window.c, which uses only the ground floor.
 * The first three use the last two; outbox_notify.c and outbox.c use none
 * of the others.  The rest of the extension sees only idempotency.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_H
#define OUTBOX_H

#include "executor/spi.h"
#include "fmgr.h"
#include "nodes/execnodes.h"
#include "storage/lockdefs.h"
#include "utils/snapshot.h"
#include "utils/timestamp.h"

#define TOPIC_MAX_LEN 40

/* the caller's rights on a topic, as the lookup statement reports them */
typedef struct Topic
{
	int32		id;
	Oid			owner;
	bool		may_publish;
	bool		may_consume;
	bool		notify;			/* NOTIFY at publish */
	int32		max_attempts;
} Topic;

/*
 * SQL: the role in col (a regrole column) exists.  A topic whose owner was
 * dropped belongs to no role: the grants its owner gave give nothing, and
 * create_topic() takes its name over.
 */
#define OUTBOX_ROLE_EXISTS(col) \
	"EXISTS (SELECT FROM pg_catalog.pg_roles AS r" \
	" WHERE r.oid OPERATOR(pg_catalog.=) " col "::pg_catalog.oid)"

typedef enum TopicRight
{
	RIGHT_PUBLISH,
	RIGHT_CONSUME,
	RIGHT_OWN
} TopicRight;

/* outbox.c */
extern void idem_outbox_not_null(FunctionCallInfo fcinfo, int arg,
								 const char *name);
extern char *idem_outbox_topic_arg(FunctionCallInfo fcinfo, int arg);
extern void idem_outbox_check_interval(const Interval *iv, const char *name,
									   bool positive);
extern Datum idem_outbox_ids_arg(FunctionCallInfo fcinfo, int arg);
extern bool idem_outbox_topic_lookup(const char *name, TopicRight right,
									 Topic *out, Snapshot snap,
									 bool missing_ok);
extern bool idem_outbox_topic_lock(int32 id, LOCKMODE mode);
extern void idem_outbox_topic_serialization_failure(const char *name,
													const char *what,
													const char *by);
extern void idem_outbox_topic_for_publish(const char *name, Topic *out);
extern void idem_outbox_topics_changed(void);
extern Oid	idem_outbox_message_seq(void);
extern void idem_outbox_key_lock(text *topic, text *key);

/* outbox_window.c */
extern int32 idem_outbox_claim_scan(Datum *values, int32 want,
									ReturnSetInfo *rsinfo, bool *full);
extern int32 idem_outbox_claim_run_shared(SPIPlanPtr *plan, const char *sql,
										  Oid *argtypes, Datum *values,
										  int32 remaining,
										  ReturnSetInfo *rsinfo);

/* outbox_notify.c */
extern void idem_outbox_notify(const char *topic);

#endif							/* OUTBOX_H */
