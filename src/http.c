/*-------------------------------------------------------------------------
 *
 * http.c
 *	  idempotency.http_response(): a response to replay byte for byte.
 *
 * The convention: {"status": s, "headers": {...}, "body": "exact text"}
 * stored as a key's response; a client replays status, chosen headers and
 * body as given.  A binary body that is not valid text in the database
 * encoding (or holds a NUL byte) goes to "body_base64" instead.
 *
 * Locking: none; IMMUTABLE.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/base64.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"

#include "compat.h"
#include "idempotency.h"

/* ---------------------------------------------------------------------
 * SQL-callable functions
 * ---------------------------------------------------------------------
 */

/*
 * http_response(status, body, headers) -> {"status": ..., "headers": {...},
 * "body": "..."}, the convention for replaying an HTTP response byte for
 * byte; the bytea form writes "body_base64" when the body is not valid in
 * the database encoding or holds a NUL byte.
 */
static Datum
http_response(FunctionCallInfo fcinfo, bool body_is_bytea)
{
	JsonbParseState *state = NULL;
	JsonbValue	k,
				v;
	JsonbValue *res;
	int32		status;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("HTTP status must not be null")));
	status = PG_GETARG_INT32(0);
	if (status < 100 || status > 599)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("HTTP status %d is out of range", status),
				 errdetail("An HTTP status is between 100 and 599.")));

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);

	k.type = jbvString;
	k.val.string.val = "status";
	k.val.string.len = 6;
	pushJsonbValue(&state, WJB_KEY, &k);
	v.type = jbvNumeric;
	v.val.numeric = DatumGetNumeric(DirectFunctionCall1(int4_numeric, Int32GetDatum(status)));
	pushJsonbValue(&state, WJB_VALUE, &v);

	k.val.string.val = "headers";
	k.val.string.len = 7;
	pushJsonbValue(&state, WJB_KEY, &k);
	if (PG_ARGISNULL(2))
	{
		pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
		pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	}
	else
	{
		Jsonb	   *headers = PG_GETARG_JSONB_P(2);
		JsonbIterator *it;
		JsonbIteratorToken tok;
		JsonbValue	hv;

		if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("HTTP headers must be a JSON object"),
					 errdetail("Give them as {\"Header-Name\": \"value\", ...}.")));
		it = JsonbIteratorInit(&headers->root);
		while ((tok = JsonbIteratorNext(&it, &hv, true)) != WJB_DONE)
		{
			if (tok == WJB_VALUE && hv.type != jbvString)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("HTTP header values must be JSON strings"),
						 errdetail("A value of type %s was given.",
								   hv.type == jbvNumeric ? "number" :
								   hv.type == jbvBool ? "boolean" :
								   hv.type == jbvNull ? "null" : "object or array")));
			pushJsonbValue(&state, tok, tok < WJB_BEGIN_ARRAY ? &hv : NULL);
		}
	}

	if (!PG_ARGISNULL(1))
	{
		bool		as_text = true;
		const char *data;
		int			len;

		if (body_is_bytea)
		{
			bytea	   *b = PG_GETARG_BYTEA_PP(1);

			data = VARDATA_ANY(b);
			len = VARSIZE_ANY_EXHDR(b);
			as_text = memchr(data, '\0', len) == NULL &&
				pg_verifymbstr(data, len, true);
		}
		else
		{
			text	   *t = PG_GETARG_TEXT_PP(1);

			data = VARDATA_ANY(t);
			len = VARSIZE_ANY_EXHDR(t);
		}
		k.val.string.val = as_text ? "body" : "body_base64";
		k.val.string.len = strlen(k.val.string.val);
		pushJsonbValue(&state, WJB_KEY, &k);
		v.type = jbvString;
		if (as_text)
		{
			v.val.string.val = (char *) data;
			v.val.string.len = len;
		}
		else
		{
			int			enclen = pg_b64_enc_len(len);
			char	   *enc = palloc(enclen + 1);

			enclen = IDEM_B64_ENCODE(data, len, enc, enclen);
			if (enclen < 0)
				elog(ERROR, "base64 encoding failed");
			v.val.string.val = enc;
			v.val.string.len = enclen;
		}
		pushJsonbValue(&state, WJB_VALUE, &v);
	}
	res = pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	PG_RETURN_JSONB_P(JsonbValueToJsonb(res));
}

/* http_response(status int, body text, headers jsonb) -> jsonb */
PG_FUNCTION_INFO_V1(idempotency_http_response);

Datum
idempotency_http_response(PG_FUNCTION_ARGS)
{
	return http_response(fcinfo, false);
}

/* http_response(status int, body bytea, headers jsonb) -> jsonb */
PG_FUNCTION_INFO_V1(idempotency_http_response_bytea);

Datum
idempotency_http_response_bytea(PG_FUNCTION_ARGS)
{
	return http_response(fcinfo, true);
}
