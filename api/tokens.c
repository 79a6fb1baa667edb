/* tokens — the /v1/tokens resource, for admins: add a named token with a
 * role (its secret is in this one reply and nowhere else), list the
 * tokens (names, roles, created; never secrets or hashes), revoke one.
 * The token files and their locking are daemon/tokens.c's; a revoked
 * token is refused from the next request on, whichever server thread
 * serves it. Must never log a secret or keep one after replying.
 */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "api/handlers.h"
#include "api/http.h"
#include "common/log.h"
#include "daemon/tokens.h"

static json_t *entry_json(const tokens_entry *e)
{
	char when[32];
	api_time_format(e->created_ms, when);
	return json_pack("{s:s, s:s, s:s}", "name", e->name, "role", tokens_role_name(e->role),
			 "created", when);
}

/* Named tokens need the daemon's token set; a server started with one
 * bare token (tests of the HTTP layer) has none to manage. */
static bool have_tokens(api_request *req, enum MHD_Result *ret)
{
	if (req->cfg->tokens)
		return true;
	*ret = api_reply_problem(req, API_P_UNAVAILABLE, NULL,
				 "this server has no token files to manage");
	return false;
}

enum MHD_Result tokens_create(api_request *req)
{
	enum MHD_Result ret;
	json_t *in = NULL;
	char detail[256], secret[65] = "";
	if (!have_tokens(req, &ret))
		return ret;
	int rc = api_json_parse(req->body, req->body_len, API_JSON_MAX_DEPTH, &in, detail,
				sizeof detail);
	if (rc)
		return api_reply_problem(req, rc == -E2BIG ? API_P_JSON_TOO_DEEP : API_P_MALFORMED_JSON,
					 NULL, "%s", req->body_len ? detail : "the body must be "
					 "{\"name\": ..., \"role\": ...}");
	const char *key;
	json_t *v;
	if (!json_is_object(in)) {
		ret = api_reply_problem(req, API_P_MALFORMED_SPEC, NULL,
					"the body must be a JSON object {\"name\", \"role\"}");
		goto out;
	}
	json_object_foreach(in, key, v) {
		if (strcmp(key, "name") != 0 && strcmp(key, "role") != 0) {
			ret = api_reply_problem(req, API_P_INVALID_REQUEST, key,
						"unknown key; a token has a name and a role");
			goto out;
		}
	}
	const char *name = json_string_value(json_object_get(in, "name"));
	const char *role_s = json_string_value(json_object_get(in, "role"));
	enum tokens_role role;
	if (!name || !tokens_name_valid(name)) {
		ret = api_reply_problem(req, API_P_INVALID_REQUEST, "name",
					"name must be a string of 1 to %d of A-Z a-z 0-9 . _ - "
					"starting with a letter or digit", TOKENS_NAME_MAX);
		goto out;
	}
	if (!role_s || tokens_role_parse(role_s, &role) < 0) {
		ret = api_reply_problem(req, API_P_INVALID_REQUEST, "role",
					"role must be \"reader\", \"user\" or \"admin\"");
		goto out;
	}
	tokens_entry made;
	rc = tokens_add(req->cfg->tokens, name, role, secret, &made);
	if (rc == -EEXIST) {
		ret = api_reply_problem(req, API_P_TOKEN_EXISTS, "name", "a token named %s exists%s",
					name, strcmp(name, TOKENS_DEFAULT_NAME) == 0
						? " (the name is reserved for the token file's)" : "");
		goto out;
	}
	if (rc < 0) {
		ret = api_reply_problem(req, API_P_INTERNAL, NULL, "cannot write the tokens file: %s",
					strerror(-rc));
		goto out;
	}
	log_info("token %s (role %s) added by %s", name, tokens_role_name(role), req->who.name);
	json_t *o = entry_json(&made);
	if (o && json_object_set_new(o, "secret", json_string(secret))) {
		json_decref(o);
		o = NULL;
	}
	ret = api_reply_json(req, MHD_HTTP_CREATED, o);
out:
	explicit_bzero(secret, sizeof secret);
	json_decref(in);
	return ret;
}

enum MHD_Result tokens_list_all(api_request *req)
{
	enum MHD_Result ret;
	static const char *const known[] = {NULL};
	if (!api_query_known(req, known, &ret) || !have_tokens(req, &ret))
		return ret;
	tokens_entry *v = NULL;
	size_t n = 0;
	if (tokens_list(req->cfg->tokens, &v, &n) < 0)
		return api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
	json_t *arr = json_array();
	for (size_t i = 0; arr && i < n; i++)
		if (json_array_append_new(arr, entry_json(&v[i]))) {
			json_decref(arr);
			arr = NULL;
		}
	free(v);
	return api_reply_json(req, MHD_HTTP_OK, arr ? json_pack("{s:o}", "tokens", arr) : NULL);
}

enum MHD_Result tokens_delete(api_request *req)
{
	enum MHD_Result ret;
	static const char *const known[] = {NULL};
	const char *name = req->args.v[0];
	if (!api_query_known(req, known, &ret) || !have_tokens(req, &ret))
		return ret;
	int rc = tokens_name_valid(name) ? tokens_revoke(req->cfg->tokens, name) : -ENOENT;
	if (rc == -ENOENT)
		return api_reply_problem(req, API_P_TOKEN_NOT_FOUND, NULL, "no token named %s", name);
	if (rc < 0)
		return api_reply_problem(req, API_P_INTERNAL, NULL, "cannot change the token files: %s",
					 strerror(-rc));
	log_info("token %s revoked by %s", name, req->who.name);
	return api_reply_empty(req, MHD_HTTP_NO_CONTENT);
}
