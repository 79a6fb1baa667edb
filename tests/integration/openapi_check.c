/* openapi_check — see openapi_check.h. A recursive-descent reader over the
 * whole file (flow collections may span lines) and a schema walker. */
#include "openapi_check.h"

#include <ctype.h>
#include <regex.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the YAML subset ---- */

typedef struct rd {
	const char *s; /* the whole file, NUL-terminated */
	size_t pos;
	char *err;
	size_t errlen;
	bool failed;
} rd;

static int line_of(const rd *r, size_t pos)
{
	int n = 1;
	for (size_t i = 0; i < pos && r->s[i]; i++)
		n += r->s[i] == '\n';
	return n;
}

__attribute__((format(printf, 2, 3)))
static json_t *bad(rd *r, const char *fmt, ...)
{
	if (!r->failed) {
		int n = snprintf(r->err, r->errlen, "line %d: ", line_of(r, r->pos));
		va_list ap;
		va_start(ap, fmt);
		if (n >= 0 && (size_t)n < r->errlen)
			vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	r->failed = true;
	return NULL;
}

/* Moves pos to the start of the next line holding content (not blank, not
 * a whole-line comment) and returns its indentation, or -1 at the end. */
static int next_content(rd *r)
{
	for (;;) {
		size_t p = r->pos;
		if (!r->s[p])
			return -1;
		int ind = 0;
		while (r->s[p + (size_t)ind] == ' ')
			ind++;
		char c = r->s[p + (size_t)ind];
		if (c == '\t')
			return bad(r, "tab in indentation"), -1;
		if (c != '\n' && c != '#' && c != '\0')
			return ind;
		const char *nl = strchr(r->s + p, '\n');
		r->pos = nl ? (size_t)(nl - r->s) + 1 : strlen(r->s);
	}
}

static bool at_eol(const rd *r)
{
	size_t p = r->pos;
	while (r->s[p] == ' ')
		p++;
	return r->s[p] == '\n' || r->s[p] == '\0';
}

static void skip_spaces(rd *r)
{
	while (r->s[r->pos] == ' ')
		r->pos++;
}

static void to_next_line(rd *r)
{
	const char *nl = strchr(r->s + r->pos, '\n');
	r->pos = nl ? (size_t)(nl - r->s) + 1 : strlen(r->s);
}

/* A plain scalar's JSON value: null, booleans, integers, reals, else a string. */
static json_t *plain_value(const char *s, size_t n)
{
	char buf[512];
	if (n >= sizeof buf)
		return json_stringn(s, n);
	memcpy(buf, s, n);
	buf[n] = '\0';
	if (!strcmp(buf, "null") || !strcmp(buf, "~"))
		return json_null();
	if (!strcmp(buf, "true"))
		return json_true();
	if (!strcmp(buf, "false"))
		return json_false();
	regex_t re;
	bool num = false, integer = false;
	if (regcomp(&re, "^-?[0-9]+$", REG_EXTENDED | REG_NOSUB) == 0) {
		integer = regexec(&re, buf, 0, NULL, 0) == 0;
		regfree(&re);
	}
	if (!integer &&
	    regcomp(&re, "^-?[0-9]+(\\.[0-9]*)?([eE][-+]?[0-9]+)?$", REG_EXTENDED | REG_NOSUB) == 0) {
		num = regexec(&re, buf, 0, NULL, 0) == 0;
		regfree(&re);
	}
	if (integer)
		return json_integer(strtoll(buf, NULL, 10));
	if (num)
		return json_real(strtod(buf, NULL));
	return json_string(buf);
}

/* A quoted scalar at pos ('"' with JSON-style escapes, '\'' with ''). */
static json_t *quoted(rd *r)
{
	char q = r->s[r->pos++];
	size_t cap = 64, n = 0;
	char *out = malloc(cap);
	if (!out)
		return bad(r, "out of memory");
	for (;;) {
		char c = r->s[r->pos];
		if (!c || c == '\n') {
			free(out);
			return bad(r, "unterminated quoted scalar");
		}
		r->pos++;
		if (c == q) {
			if (q == '\'' && r->s[r->pos] == '\'') {
				r->pos++;
			} else {
				break;
			}
		} else if (q == '"' && c == '\\') {
			char e = r->s[r->pos++];
			switch (e) {
			case 'n': c = '\n'; break;
			case 't': c = '\t'; break;
			case '"': case '\\': case '/': c = e; break;
			case 'u': {
				unsigned v = 0;
				for (int i = 0; i < 4; i++) {
					char h = r->s[r->pos++];
					v = v * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0'
							: (tolower((unsigned char)h) - 'a' + 10));
				}
				if (v > 0x7f) {
					free(out);
					return bad(r, "non-ASCII \\u escape");
				}
				c = (char)v;
				break;
			}
			default:
				free(out);
				return bad(r, "unknown escape \\%c", e);
			}
		}
		if (n + 2 > cap) {
			char *p = realloc(out, cap *= 2);
			if (!p) {
				free(out);
				return bad(r, "out of memory");
			}
			out = p;
		}
		out[n++] = c;
	}
	json_t *v = json_stringn(out, n);
	free(out);
	return v;
}

static void skip_flow_space(rd *r)
{
	while (r->s[r->pos] == ' ' || r->s[r->pos] == '\n')
		r->pos++;
}

static json_t *flow_value(rd *r);

/* A plain scalar in a flow collection: up to , ] } or ": ". */
static json_t *flow_plain(rd *r, bool key)
{
	size_t b = r->pos;
	while (r->s[r->pos] && !strchr(",]}\n", r->s[r->pos]) &&
	       !(r->s[r->pos] == ':' && (r->s[r->pos + 1] == ' ' || (key && r->s[r->pos + 1] == '\n'))))
		r->pos++;
	size_t e = r->pos;
	while (e > b && r->s[e - 1] == ' ')
		e--;
	if (e == b)
		return bad(r, "empty scalar in a flow collection");
	return key ? json_stringn(r->s + b, e - b) : plain_value(r->s + b, e - b);
}

static json_t *flow_value(rd *r)
{
	skip_flow_space(r);
	char c = r->s[r->pos];
	if (c == '"' || c == '\'')
		return quoted(r);
	if (c != '{' && c != '[')
		return flow_plain(r, false);
	r->pos++;
	bool obj = c == '{';
	json_t *v = obj ? json_object() : json_array();
	skip_flow_space(r);
	if (r->s[r->pos] == (obj ? '}' : ']')) {
		r->pos++;
		return v;
	}
	for (;;) {
		skip_flow_space(r);
		if (obj) {
			json_t *k = r->s[r->pos] == '"' || r->s[r->pos] == '\'' ? quoted(r) : flow_plain(r, true);
			skip_flow_space(r);
			if (!k || r->s[r->pos] != ':') {
				json_decref(k);
				json_decref(v);
				return bad(r, "expected ':' in a flow mapping");
			}
			r->pos++;
			json_t *x = flow_value(r);
			if (!x) {
				json_decref(k);
				json_decref(v);
				return NULL;
			}
			json_object_set_new(v, json_string_value(k), x);
			json_decref(k);
		} else {
			json_t *x = flow_value(r);
			if (!x) {
				json_decref(v);
				return NULL;
			}
			json_array_append_new(v, x);
		}
		skip_flow_space(r);
		char d = r->s[r->pos++];
		if (d == (obj ? '}' : ']'))
			return v;
		if (d != ',') {
			json_decref(v);
			return bad(r, "expected ',' or the end of a flow %s", obj ? "mapping" : "sequence");
		}
	}
}

static json_t *block_node(rd *r, int min_indent);
static json_t *block_map(rd *r, int ind, bool inline_first);

/* A block scalar (| or >) under a key at indentation ind: its text. */
static json_t *block_scalar(rd *r, int ind)
{
	bool fold = r->s[r->pos] == '>';
	to_next_line(r);
	size_t cap = 256, n = 0;
	char *out = malloc(cap);
	int body = -1;
	while (out && r->s[r->pos]) {
		size_t p = r->pos;
		int i = 0;
		while (r->s[p + (size_t)i] == ' ')
			i++;
		char c = r->s[p + (size_t)i];
		bool blank = c == '\n' || c == '\0';
		if (!blank && i <= ind)
			break;
		if (!blank && body < 0)
			body = i;
		const char *nl = strchr(r->s + p, '\n');
		size_t end = nl ? (size_t)(nl - r->s) : strlen(r->s);
		size_t from = blank ? end : p + (size_t)body;
		size_t len = end > from ? end - from : 0;
		if (n + len + 2 > cap) {
			while (n + len + 2 > cap)
				cap *= 2;
			char *q = realloc(out, cap);
			if (!q)
				break;
			out = q;
		}
		memcpy(out + n, r->s + from, len);
		n += len;
		out[n++] = fold && !blank ? ' ' : '\n';
		r->pos = nl ? end + 1 : end;
	}
	if (!out)
		return bad(r, "out of memory");
	if (fold && n > 0 && out[n - 1] == ' ')
		out[n - 1] = '\n'; /* clip: one final line break */
	json_t *v = json_stringn(out, n);
	free(out);
	return v;
}

/* The value after "key:" or "- " on the current line, for a node at
 * indentation ind. */
static json_t *inline_value(rd *r, int ind, bool in_map)
{
	skip_spaces(r);
	char c = r->s[r->pos];
	if (c == '\n' || c == '\0') {
		to_next_line(r);
		int next = next_content(r);
		if (next > ind)
			return block_node(r, ind + 1);
		/* "key:" followed by "- item" at the key's own indentation */
		if (in_map && next == ind && r->s[r->pos + (size_t)next] == '-')
			return block_node(r, ind);
		return json_null();
	}
	json_t *v;
	if (c == '|' || c == '>')
		return block_scalar(r, ind);
	if (c == '{' || c == '[' || c == '"' || c == '\'') {
		v = c == '"' || c == '\'' ? quoted(r) : flow_value(r);
		if (v && !at_eol(r)) {
			json_decref(v);
			return bad(r, "text after a %s", c == '"' || c == '\'' ? "quoted scalar" : "flow collection");
		}
		to_next_line(r);
		return v;
	}
	size_t b = r->pos;
	const char *nl = strchr(r->s + b, '\n');
	size_t e = nl ? (size_t)(nl - r->s) : strlen(r->s);
	r->pos = e;
	to_next_line(r);
	while (e > b && r->s[e - 1] == ' ')
		e--;
	/* a plain scalar may continue on more-indented lines (folded with a space) */
	int next = next_content(r);
	if (next <= ind)
		return plain_value(r->s + b, e - b);
	size_t cap = (e - b) + 256, n = e - b;
	char *out = malloc(cap);
	if (!out)
		return bad(r, "out of memory");
	memcpy(out, r->s + b, n);
	while ((next = next_content(r)) > ind) {
		size_t p = r->pos + (size_t)next;
		const char *nl2 = strchr(r->s + p, '\n');
		size_t end = nl2 ? (size_t)(nl2 - r->s) : strlen(r->s);
		if (n + (end - p) + 2 > cap) {
			cap = (n + (end - p) + 2) * 2;
			char *q = realloc(out, cap);
			if (!q) {
				free(out);
				return bad(r, "out of memory");
			}
			out = q;
		}
		out[n++] = ' ';
		memcpy(out + n, r->s + p, end - p);
		n += end - p;
		r->pos = end;
		to_next_line(r);
	}
	v = json_stringn(out, n);
	free(out);
	return v;
}

/* The column of pos within its line. */
static int column(const rd *r)
{
	size_t p = r->pos;
	while (p > 0 && r->s[p - 1] != '\n')
		p--;
	return (int)(r->pos - p);
}

/* A sequence whose "- " marks sit at indentation ind. */
static json_t *block_seq(rd *r, int ind)
{
	json_t *a = json_array();
	while (next_content(r) == ind && r->s[r->pos + (size_t)ind] == '-' &&
	       (r->s[r->pos + (size_t)ind + 1] == ' ' || r->s[r->pos + (size_t)ind + 1] == '\n')) {
		r->pos += (size_t)ind + 1;
		skip_spaces(r);
		/* "- key: value" opens a mapping whose keys line up with "key" */
		const char *line = r->s + r->pos;
		const char *colon = strstr(line, ": ");
		const char *nl = strchr(line, '\n');
		const char *colon_eol = strchr(line, ':');
		bool is_map = *line != '{' && *line != '[' && *line != '"' && *line != '\'' &&
			      ((colon && (!nl || colon < nl)) ||
			       (colon_eol && nl && colon_eol + 1 == nl));
		json_t *item;
		if (is_map)
			item = block_map(r, 0, true);
		else
			item = inline_value(r, ind, false);
		if (!item) {
			json_decref(a);
			return NULL;
		}
		json_array_append_new(a, item);
	}
	return a;
}

/* A mapping whose keys sit at indentation ind; with inline_first, the first
 * key starts at pos (after a sequence's "- "). */
static json_t *block_map(rd *r, int ind, bool inline_first)
{
	json_t *m = json_object();
	bool first = inline_first;
	if (first)
		ind = column(r);
	for (;;) {
		if (!first) {
			int i = next_content(r);
			if (i != ind || r->s[r->pos + (size_t)i] == '-')
				break;
			r->pos += (size_t)i;
		}
		first = false;
		json_t *k;
		if (r->s[r->pos] == '"' || r->s[r->pos] == '\'') {
			k = quoted(r);
		} else {
			size_t b = r->pos;
			while (r->s[r->pos] && r->s[r->pos] != '\n' &&
			       !(r->s[r->pos] == ':' && (r->s[r->pos + 1] == ' ' || r->s[r->pos + 1] == '\n')))
				r->pos++;
			k = json_stringn(r->s + b, r->pos - b);
		}
		if (!k || r->s[r->pos] != ':') {
			json_decref(k);
			json_decref(m);
			return bad(r, "expected \"key:\"");
		}
		r->pos++;
		json_t *v = inline_value(r, ind, true);
		if (!v) {
			json_decref(k);
			json_decref(m);
			return NULL;
		}
		if (json_object_get(m, json_string_value(k))) {
			json_decref(v);
			json_decref(m);
			bad(r, "duplicate key %s", json_string_value(k));
			json_decref(k);
			return NULL;
		}
		json_object_set_new(m, json_string_value(k), v);
		json_decref(k);
	}
	return m;
}

static json_t *block_node(rd *r, int min_indent)
{
	int ind = next_content(r);
	if (ind < min_indent)
		return json_null();
	const char *c = r->s + r->pos + ind;
	if (c[0] == '-' && (c[1] == ' ' || c[1] == '\n'))
		return block_seq(r, ind);
	if (c[0] == '{' || c[0] == '[') { /* a flow collection on its own lines */
		r->pos += (size_t)ind;
		json_t *v = flow_value(r);
		if (v && !at_eol(r)) {
			json_decref(v);
			return bad(r, "text after a flow collection");
		}
		to_next_line(r);
		return v;
	}
	return block_map(r, ind, false);
}

json_t *openapi_load(const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(err, errlen, "%s: cannot open", path);
		return NULL;
	}
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
	if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
		fclose(f);
		free(buf);
		snprintf(err, errlen, "%s: cannot read", path);
		return NULL;
	}
	fclose(f);
	buf[n] = '\0';
	char msg[256] = "";
	rd r = {.s = buf, .err = msg, .errlen = sizeof msg};
	json_t *doc = block_node(&r, 0);
	if (doc && !r.failed && next_content(&r) != -1)
		bad(&r, "content after the document (indentation?)");
	if (r.failed) {
		json_decref(doc);
		doc = NULL;
		snprintf(err, errlen, "%s: %s", path, msg);
	}
	free(buf);
	return doc;
}

/* ---- the schema walker ---- */

/* "#/a/b" in doc (~1 and ~0 unescaped), or NULL. */
static json_t *resolve_ref(json_t *doc, const char *ref)
{
	if (strncmp(ref, "#/", 2) != 0)
		return NULL;
	json_t *cur = doc;
	const char *p = ref + 2;
	while (cur && *p) {
		char key[256];
		size_t n = 0;
		for (; *p && *p != '/' && n + 1 < sizeof key; p++) {
			if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
				key[n++] = p[1] == '1' ? '/' : '~';
				p++;
			} else {
				key[n++] = *p;
			}
		}
		key[n] = '\0';
		cur = json_object_get(cur, key);
		if (*p == '/')
			p++;
	}
	return cur;
}

json_t *openapi_response_schema(json_t *doc, const char *path, const char *method,
				const char *status, const char *ctype)
{
	json_t *resp = json_object_get(json_object_get(json_object_get(json_object_get(
		json_object_get(doc, "paths"), path), method), "responses"), status);
	json_t *ref = json_object_get(resp, "$ref");
	if (json_is_string(ref))
		resp = resolve_ref(doc, json_string_value(ref));
	return json_object_get(json_object_get(json_object_get(resp, "content"), ctype), "schema");
}

typedef struct ck {
	json_t *doc;
	char *err;
	size_t errlen;
	int depth;
} ck;

__attribute__((format(printf, 3, 4)))
static int mismatch(ck *c, const char *where, const char *fmt, ...)
{
	int n = snprintf(c->err, c->errlen, "%s: ", where[0] ? where : "/");
	va_list ap;
	va_start(ap, fmt);
	if (n >= 0 && (size_t)n < c->errlen)
		vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
	va_end(ap);
	return -1;
}

static bool type_is(json_t *v, const char *t)
{
	if (!strcmp(t, "object"))
		return json_is_object(v);
	if (!strcmp(t, "array"))
		return json_is_array(v);
	if (!strcmp(t, "string"))
		return json_is_string(v);
	if (!strcmp(t, "integer"))
		return json_is_integer(v);
	if (!strcmp(t, "number"))
		return json_is_number(v);
	if (!strcmp(t, "boolean"))
		return json_is_boolean(v);
	if (!strcmp(t, "null"))
		return json_is_null(v);
	return false;
}

static const char *kind_of(json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a real";
	case JSON_TRUE: case JSON_FALSE: return "a boolean";
	default: return "null";
	}
}

static int check_at(ck *c, json_t *s, json_t *v, const char *where)
{
	if (!json_is_object(s))
		return json_is_false(s) ? mismatch(c, where, "not allowed") : 0;
	if (++c->depth > 64) {
		c->depth--;
		return mismatch(c, where, "schema nests too deep ($ref loop?)");
	}
	int rc = 0;
	char sub[512];
	json_t *x;
	if ((x = json_object_get(s, "$ref"))) {
		json_t *t = resolve_ref(c->doc, json_string_value(x));
		rc = t ? check_at(c, t, v, where)
		       : mismatch(c, where, "unresolvable $ref %s", json_string_value(x));
		if (rc)
			goto out;
	}
	if ((x = json_object_get(s, "type"))) {
		bool ok = false;
		if (json_is_string(x)) {
			ok = type_is(v, json_string_value(x));
		} else {
			size_t i;
			json_t *t;
			json_array_foreach(x, i, t) ok = ok || type_is(v, json_string_value(t));
		}
		if (!ok) {
			char *want = json_dumps(x, JSON_ENCODE_ANY | JSON_COMPACT);
			rc = mismatch(c, where, "is %s, the schema says type %s", kind_of(v), want ? want : "?");
			free(want);
			goto out;
		}
	}
	if ((x = json_object_get(s, "const")) && !json_equal(x, v)) {
		rc = mismatch(c, where, "is not the schema's const");
		goto out;
	}
	if ((x = json_object_get(s, "enum"))) {
		bool ok = false;
		size_t i;
		json_t *e;
		json_array_foreach(x, i, e) ok = ok || json_equal(e, v);
		if (!ok) {
			char *got = json_dumps(v, JSON_ENCODE_ANY);
			rc = mismatch(c, where, "%s is not in the schema's enum", got ? got : "?");
			free(got);
			goto out;
		}
	}
	if (json_is_number(v)) {
		double d = json_number_value(v);
		if ((x = json_object_get(s, "minimum")) && d < json_number_value(x)) {
			rc = mismatch(c, where, "%g is under the minimum", d);
			goto out;
		}
		if ((x = json_object_get(s, "maximum")) && d > json_number_value(x)) {
			rc = mismatch(c, where, "%g is over the maximum", d);
			goto out;
		}
	}
	if (json_is_string(v) && (x = json_object_get(s, "pattern"))) {
		regex_t re;
		if (regcomp(&re, json_string_value(x), REG_EXTENDED | REG_NOSUB) != 0) {
			rc = mismatch(c, where, "the schema's pattern does not compile");
			goto out;
		}
		bool ok = regexec(&re, json_string_value(v), 0, NULL, 0) == 0;
		regfree(&re);
		if (!ok) {
			rc = mismatch(c, where, "\"%s\" does not match %s", json_string_value(v),
				      json_string_value(x));
			goto out;
		}
	}
	const char *alts[] = {"oneOf", "anyOf"};
	for (int a = 0; a < 2; a++) {
		if (!(x = json_object_get(s, alts[a])))
			continue;
		size_t i, hits = 0;
		json_t *alt;
		char first[512] = "";
		json_array_foreach(x, i, alt) {
			if (check_at(c, alt, v, where) == 0)
				hits++;
			else if (!first[0])
				snprintf(first, sizeof first, "%s", c->err);
		}
		if (hits == 0 || (a == 0 && hits > 1)) {
			rc = hits ? mismatch(c, where, "matches %zu of oneOf's schemas", hits)
				  : mismatch(c, where, "matches none of %s's schemas (first: %s)", alts[a], first);
			goto out;
		}
	}
	if (json_is_object(v)) {
		json_t *props = json_object_get(s, "properties");
		size_t i;
		json_t *req;
		json_array_foreach(json_object_get(s, "required"), i, req) {
			if (!json_object_get(v, json_string_value(req))) {
				rc = mismatch(c, where, "lacks required \"%s\"", json_string_value(req));
				goto out;
			}
		}
		json_t *extra = json_object_get(s, "additionalProperties");
		const char *k;
		json_t *mv;
		json_object_foreach(v, k, mv) {
			snprintf(sub, sizeof sub, "%s/%s", where, k);
			json_t *ps = json_object_get(props, k);
			if (ps)
				rc = check_at(c, ps, mv, sub);
			else if (extra)
				rc = json_is_false(extra) ? mismatch(c, sub, "is not in the schema's properties")
							  : check_at(c, extra, mv, sub);
			if (rc)
				goto out;
		}
	}
	if (json_is_array(v) && (x = json_object_get(s, "items"))) {
		size_t i;
		json_t *e;
		json_array_foreach(v, i, e) {
			snprintf(sub, sizeof sub, "%s/%zu", where, i);
			if ((rc = check_at(c, x, e, sub)))
				goto out;
		}
	}
out:
	c->depth--;
	return rc;
}

int openapi_check(json_t *doc, json_t *schema, json_t *value, char *err, size_t errlen)
{
	ck c = {.doc = doc, .err = err, .errlen = errlen};
	if (!schema)
		return snprintf(err, errlen, "no schema"), -1;
	return check_at(&c, schema, value, "");
}
