/* openapi_check — reads docs/openapi.yaml and checks real responses against
 * its schemas, so the document and the daemon cannot drift apart unseen.
 *
 * The reader takes the YAML subset the document is written in (block
 * mappings and sequences, flow collections over several lines, plain and
 * quoted scalars, | and > block scalars, whole-line comments), not YAML in
 * general: anything else is an error naming the line, never a guess. The
 * checker implements the JSON Schema keywords the document uses for
 * response bodies: $ref (local), type, properties, required,
 * additionalProperties, items, oneOf, anyOf, enum, const, minimum, maximum,
 * pattern (POSIX extended). Others (format, description, examples, ...) are
 * ignored. */
#ifndef BERTD_TESTS_OPENAPI_CHECK_H
#define BERTD_TESTS_OPENAPI_CHECK_H

#include <jansson.h>
#include <stddef.h>

/* The document at path as JSON (caller decrefs), or NULL with err filled
 * ("file:line: what"). */
json_t *openapi_load(const char *path, char *err, size_t errlen);

/* The schema of the response of method (lower case: "get") on the path
 * template ("/v1/jobs/{id}") with status ("200") and content type
 * ("application/json"), $refs of components/responses followed; borrowed
 * from doc. NULL when the document has none. */
json_t *openapi_response_schema(json_t *doc, const char *path, const char *method,
				const char *status, const char *ctype);

/* Checks value against schema ($refs resolved in doc). Returns 0, or -1
 * with err filled with the JSON path of the first mismatch and why. */
int openapi_check(json_t *doc, json_t *schema, json_t *value, char *err, size_t errlen);

#endif
