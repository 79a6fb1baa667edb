/* problem — see problem.h. The table below is the single list of the API's
 * error codes; adding one means adding a row here and a line in docs/api.md.
 * Must never carry request bodies or secrets into a reply. */
#include "api/problem.h"

#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "daemon/store.h"

static const struct {
	const char *code;
	int status;
	const char *title;
	int retry_after_s; /* Retry-After of the reply; 0 none */
} problems[API_P_COUNT] = {
	[API_P_BAD_REQUEST]        = {"bad-request", 400, "Bad request"},
	[API_P_MALFORMED_JSON]     = {"malformed-json", 400, "Request body is not valid JSON"},
	[API_P_JSON_TOO_DEEP]      = {"json-too-deep", 400, "Request body nests too deeply"},
	[API_P_INVALID_PARAMETER]  = {"invalid-parameter", 400, "Invalid request parameter"},
	[API_P_MALFORMED_SPEC]     = {"malformed-spec", 400, "Job spec has the wrong shape"},
	[API_P_UNAUTHORIZED]       = {"unauthorized", 401, "Missing or invalid bearer token"},
	[API_P_NOT_FOUND]          = {"not-found", 404, "No such resource"},
	[API_P_JOB_NOT_FOUND]      = {"job-not-found", 404, "No such job"},
	[API_P_METHOD_NOT_ALLOWED] = {"method-not-allowed", 405, "Method not allowed on this resource"},
	[API_P_JOB_STATE_CONFLICT] = {"job-state-conflict", 409, "Job state does not allow this"},
	[API_P_BODY_TOO_LARGE]     = {"body-too-large", 413, "Request body too large"},
	[API_P_UNSUPPORTED_MEDIA]  = {"unsupported-media-type", 415,
				      "Request body must be application/json"},
	[API_P_INVALID_SPEC]       = {"invalid-spec", 422, "Invalid job spec"},
	[API_P_IDEMPOTENCY_REUSE]  = {"idempotency-key-reused", 422,
				      "Idempotency-Key already used with a different request"},
	[API_P_DATASET_NOT_FOUND]  = {"dataset-not-found", 404, "No such dataset"},
	[API_P_DATASET_EXISTS]     = {"dataset-exists", 409, "A dataset with this name exists"},
	[API_P_DATASET_STATE]      = {"dataset-state-conflict", 409, "Dataset state does not allow this"},
	[API_P_PATH_FORBIDDEN]     = {"path-forbidden", 403, "Path is outside the configured data roots"},
	[API_P_INVALID_REQUEST]    = {"invalid-request", 422, "Invalid request"},
	[API_P_INTERNAL]           = {"internal", 500, "Internal error"},
	[API_P_UNAVAILABLE]        = {"unavailable", 503, "Service unavailable", 1},
	[API_P_TRANSFER_CODING]    = {"transfer-encoding-not-implemented", 501,
				      "Transfer-Encoding not implemented"},
	[API_P_DB_BUSY]            = {"database-busy", 503, "Job database is locked; retry", 1},
	[API_P_DB_FULL]            = {"insufficient-storage", 507,
				      "Insufficient storage"},
	[API_P_DB_DAMAGED]         = {"database-damaged", 500, "Job database is damaged"},
	[API_P_TOO_MANY_FOLLOWERS] = {"too-many-followers", 429,
				      "Too many follow streams open; retry later", 5},
	[API_P_NODES_UNAVAILABLE]  = {"nodes-unavailable", 409,
				      "Fewer cluster nodes are up than the job asks for"},
	[API_P_EXPORT_FAILED]      = {"export-failed", 500, "Converting the checkpoint failed"},
	[API_P_EXPORT_TIMEOUT]     = {"export-timeout", 504,
				      "Converting the checkpoint did not finish in time"},
	[API_P_EXPORT_BUSY]        = {"export-busy", 503,
				      "Other checkpoint conversions are running; retry", 2},
	[API_P_FORBIDDEN]          = {"forbidden", 403, "The token's role does not allow this"},
	[API_P_TOKEN_NOT_FOUND]    = {"token-not-found", 404, "No such API token"},
	[API_P_TOKEN_EXISTS]       = {"token-exists", 409, "An API token with that name exists"},
};

static enum api_problem checked(enum api_problem p)
{
	assert(p >= 0 && p < API_P_COUNT);
	return (p >= 0 && p < API_P_COUNT) ? p : API_P_INTERNAL;
}

const char *api_problem_code(enum api_problem p) { return problems[checked(p)].code; }
int api_problem_status(enum api_problem p) { return problems[checked(p)].status; }
const char *api_problem_title(enum api_problem p) { return problems[checked(p)].title; }
int api_problem_retry_after(enum api_problem p) { return problems[checked(p)].retry_after_s; }

enum api_problem api_problem_of_store(int rc)
{
	switch (rc) {
	case STORE_E_LOCKED:
		return API_P_DB_BUSY;
	case STORE_E_FULL:
		return API_P_DB_FULL;
	case STORE_E_DAMAGED:
		return API_P_DB_DAMAGED;
	default:
		return API_P_INTERNAL;
	}
}

const char *api_problem_store_text(int rc)
{
	switch (rc) {
	case STORE_E_LOCKED:
		return "the database is locked by another process or busy with other calls; "
		       "nothing was changed";
	case STORE_E_FULL:
		return "the file system holding the database is full; nothing was changed";
	case STORE_E_DAMAGED:
		return "the database file is damaged; nothing was changed, and no write is "
		       "accepted until an operator restores it (docs/operations.md)";
	default:
		return strerror(rc < 0 ? -rc : rc);
	}
}

/* Details may quote client input (a bad query value); keep the reply valid
 * UTF-8 even when that input is not. */
static json_t *safe_string(const char *s)
{
	json_t *j = json_string(s);
	if (j)
		return j;
	char buf[512];
	size_t i = 0;
	for (; s[i] && i < sizeof buf - 1; i++)
		buf[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
	buf[i] = 0;
	return json_string(buf);
}

json_t *api_problem_json(enum api_problem p, const char *detail, const char *field,
			 const char *instance)
{
	p = checked(p);
	json_t *o = json_pack("{s:s+, s:s, s:i}", "type", "urn:bertd:problem:", problems[p].code,
			      "title", problems[p].title, "status", problems[p].status);
	if (!o)
		return NULL;
	int rc = 0;
	if (detail)
		rc |= json_object_set_new(o, "detail", safe_string(detail));
	if (instance)
		rc |= json_object_set_new(o, "instance", safe_string(instance));
	if (field && field[0])
		rc |= json_object_set_new(o, "field", safe_string(field));
	if (rc) {
		json_decref(o);
		return NULL;
	}
	return o;
}
