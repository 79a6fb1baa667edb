/* problem — the one way the API says no: RFC 9457 application/problem+json.
 *
 * Every error reply is built here from a stable machine code (the table in
 * problem.c is the only list of them; docs/api.md mirrors it). A body reads
 *   {"type":"urn:bertd:problem:<code>","title":...,"status":N,"detail":...,
 *    "instance":"<request path>", "field":"<dotted.path>"}
 * with "field" only when one input is at fault. Never invents status codes
 * per call site: the code decides the status.
 */
#ifndef BERTD_API_PROBLEM_H
#define BERTD_API_PROBLEM_H

#include <jansson.h>

enum api_problem {
	API_P_BAD_REQUEST = 0,     /* 400 generic: the request cannot be read */
	API_P_MALFORMED_JSON,      /* 400 body is not valid JSON */
	API_P_JSON_TOO_DEEP,       /* 400 body nests deeper than API_JSON_MAX_DEPTH */
	API_P_INVALID_PARAMETER,   /* 400 query parameter or header value refused */
	API_P_MALFORMED_SPEC,      /* 400 spec has the wrong JSON shape/type */
	API_P_UNAUTHORIZED,        /* 401 missing or wrong bearer token */
	API_P_NOT_FOUND,           /* 404 no such route */
	API_P_JOB_NOT_FOUND,       /* 404 no such job */
	API_P_METHOD_NOT_ALLOWED,  /* 405 path exists, method does not */
	API_P_JOB_STATE_CONFLICT,  /* 409 the job's state does not allow it */
	API_P_BODY_TOO_LARGE,      /* 413 body over max_body_bytes */
	API_P_UNSUPPORTED_MEDIA,   /* 415 body not application/json */
	API_P_INVALID_SPEC,        /* 422 spec well-formed but invalid */
	API_P_IDEMPOTENCY_REUSE,   /* 422 Idempotency-Key reused with another body */
	API_P_DATASET_NOT_FOUND,   /* 404 no such dataset */
	API_P_DATASET_EXISTS,      /* 409 a dataset with that name exists */
	API_P_DATASET_STATE,       /* 409 the dataset's state does not allow it */
	API_P_PATH_FORBIDDEN,      /* 403 a path resolves outside the data roots */
	API_P_INVALID_REQUEST,     /* 422 request well-formed but invalid (not a job spec) */
	API_P_INTERNAL,            /* 500 the daemon failed (logged) */
	API_P_UNAVAILABLE,         /* 503 the daemon cannot serve it right now */
	API_P_TRANSFER_CODING,     /* 501 a Transfer-Encoding other than chunked */
	API_P_DB_BUSY,             /* 503 the job database is locked (Retry-After) */
	API_P_DB_FULL,             /* 507 no space left for the job database, or job files at the
				    * configured disk ceiling (one code: insufficient-storage) */
	API_P_DB_DAMAGED,          /* 500 the job database file is damaged */
	API_P_TOO_MANY_FOLLOWERS,  /* 429 follow streams at their limit (Retry-After) */
	API_P_NODES_UNAVAILABLE,   /* 409 fewer Slurm nodes up than a multi-node job asks for */
	API_P_EXPORT_FAILED,       /* 500 converting a checkpoint into an HF model failed */
	API_P_EXPORT_TIMEOUT,      /* 504 converting a checkpoint ran past its deadline */
	API_P_EXPORT_BUSY,         /* 503 conversions at their limit (Retry-After) */
	API_P_FORBIDDEN,           /* 403 the token's role may not do this (role, action members) */
	API_P_TOKEN_NOT_FOUND,     /* 404 no such API token */
	API_P_TOKEN_EXISTS,        /* 409 an API token with that name exists */
	API_P_COUNT
};

/* The stable code ("not-found"), HTTP status and title of a problem. */
const char *api_problem_code(enum api_problem p);
int api_problem_status(enum api_problem p);
const char *api_problem_title(enum api_problem p);
/* Seconds a client should wait before retrying (the Retry-After header of
 * the reply), or 0 for none. */
int api_problem_retry_after(enum api_problem p);

/* The one mapping of store errors (daemon/store.h) to problems:
 * STORE_E_LOCKED -> database-busy (503), STORE_E_FULL -> insufficient-storage
 * (507), STORE_E_DAMAGED -> database-damaged (500), anything else ->
 * internal (500). */
enum api_problem api_problem_of_store(int rc);
/* A phrase for the detail of such a reply ("the database is locked by
 * another process or call"); strerror for errors not in the list. */
const char *api_problem_store_text(int rc);

/* Builds a problem body. detail, field and instance may be NULL (omitted;
 * an empty field is omitted too). Returns a new object (caller owns), or NULL
 * on allocation failure. */
json_t *api_problem_json(enum api_problem p, const char *detail, const char *field,
			 const char *instance);

#endif
