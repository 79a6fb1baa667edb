/* yaml2json — YAML to JSON for bertctl's spec files (yaml2json.h), over
 * libyaml's event parser: one recursive descent per node, anchors kept in
 * a small list so an alias is its anchor's value. Plain scalars are typed
 * by the YAML 1.2 core schema (null, bool, int, float); quoted and block
 * scalars stay strings. Must never accept what it cannot represent in JSON
 * exactly: it refuses, naming the line and column. */
#include "client/yaml2json.h"

#include <errno.h>
#include <math.h>
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#define TAG_PREFIX "tag:yaml.org,2002:"

typedef struct anchor {
	char *name;
	json_t *value; /* one reference held */
	struct anchor *next;
} anchor;

typedef struct {
	yaml_parser_t p;
	anchor *anchors;
	char *err;
	size_t errn;
} y2j;

static void fail_at(y2j *y, yaml_mark_t m, const char *fmt, ...)
{
	char why[200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	snprintf(y->err, y->errn, "line %zu, column %zu: %s", m.line + 1, m.column + 1, why);
}

/* The next event into ev; 0, or -1 with the parser's error in y->err. */
static int next(y2j *y, yaml_event_t *ev)
{
	if (yaml_parser_parse(&y->p, ev))
		return 0;
	fail_at(y, y->p.problem_mark, "%s%s%s", y->p.problem ? y->p.problem : "not YAML",
		y->p.context ? " " : "", y->p.context ? y->p.context : "");
	return -1;
}

static int matches(const char *re, const char *s)
{
	regex_t r;
	if (regcomp(&r, re, REG_EXTENDED | REG_NOSUB) != 0)
		return 0;
	int ok = regexec(&r, s, 0, NULL, 0) == 0;
	regfree(&r);
	return ok;
}

/* A plain scalar typed by the core schema (YAML 1.2, 10.3.2); NULL with
 * y->err set when it is a float JSON has no number for, or an integer
 * beyond 64 bits. */
static json_t *plain_scalar(y2j *y, const yaml_event_t *ev)
{
	const char *s = (const char *)ev->data.scalar.value;
	if (matches("^(null|Null|NULL|~|)$", s))
		return json_null();
	if (matches("^(true|True|TRUE)$", s))
		return json_true();
	if (matches("^(false|False|FALSE)$", s))
		return json_false();
	int base = matches("^[-+]?[0-9]+$", s) ? 10 : matches("^0o[0-7]+$", s) ? 8
					      : matches("^0x[0-9a-fA-F]+$", s) ? 16 : 0;
	if (base) {
		char *end;
		errno = 0;
		long long v = strtoll(base == 10 ? s : s + 2, &end, base);
		if (errno == ERANGE) {
			fail_at(y, ev->start_mark, "the integer %s does not fit in 64 bits", s);
			return NULL;
		}
		return json_integer(v);
	}
	if (matches("^[-+]?(\\.inf|\\.Inf|\\.INF)$", s) || matches("^(\\.nan|\\.NaN|\\.NAN)$", s)) {
		fail_at(y, ev->start_mark, "%s: JSON has no infinity or NaN", s);
		return NULL;
	}
	if (matches("^[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?$", s)) {
		double v = strtod(s, NULL);
		if (!isfinite(v)) {
			fail_at(y, ev->start_mark, "the number %s is out of range", s);
			return NULL;
		}
		return json_real(v);
	}
	return json_stringn(s, ev->data.scalar.length);
}

static json_t *scalar(y2j *y, const yaml_event_t *ev)
{
	const char *tag = (const char *)ev->data.scalar.tag;
	const char *s = (const char *)ev->data.scalar.value;
	if (tag && strcmp(tag, "!") != 0) {
		if (strcmp(tag, TAG_PREFIX "str") == 0)
			return json_stringn(s, ev->data.scalar.length);
		if (strncmp(tag, TAG_PREFIX, strlen(TAG_PREFIX)) == 0) {
			/* !!int, !!float, ...: the value must already read as one */
			json_t *v = plain_scalar(y, ev);
			const char *t = tag + strlen(TAG_PREFIX);
			int ok = v && ((strcmp(t, "null") == 0 && json_is_null(v)) ||
				       (strcmp(t, "bool") == 0 && json_is_boolean(v)) ||
				       (strcmp(t, "int") == 0 && json_is_integer(v)) ||
				       (strcmp(t, "float") == 0 && json_is_number(v)));
			if (ok && json_is_integer(v) && strcmp(t, "float") == 0) {
				json_t *r = json_real((double)json_integer_value(v));
				json_decref(v);
				return r;
			}
			if (ok)
				return v;
			if (v)
				fail_at(y, ev->start_mark, "\"%s\" is not a %s", s, t);
			json_decref(v);
			return NULL;
		}
		fail_at(y, ev->start_mark, "the tag %s has no JSON meaning", tag);
		return NULL;
	}
	if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || (tag && strcmp(tag, "!") == 0))
		return json_stringn(s, ev->data.scalar.length);
	return plain_scalar(y, ev);
}

static json_t *node(y2j *y, yaml_event_t *ev);

static json_t *sequence(y2j *y)
{
	json_t *arr = json_array();
	for (;;) {
		yaml_event_t ev;
		if (next(y, &ev)) {
			json_decref(arr);
			return NULL;
		}
		if (ev.type == YAML_SEQUENCE_END_EVENT) {
			yaml_event_delete(&ev);
			return arr;
		}
		json_t *v = node(y, &ev);
		yaml_event_delete(&ev);
		if (!v) {
			json_decref(arr);
			return NULL;
		}
		json_array_append_new(arr, v);
	}
}

static json_t *mapping(y2j *y)
{
	json_t *obj = json_object();
	for (;;) {
		yaml_event_t kev, vev;
		if (next(y, &kev))
			goto fail;
		if (kev.type == YAML_MAPPING_END_EVENT) {
			yaml_event_delete(&kev);
			return obj;
		}
		if (kev.type != YAML_SCALAR_EVENT) {
			fail_at(y, kev.start_mark, "a key must be a scalar (JSON keys are strings)");
			yaml_event_delete(&kev);
			goto fail;
		}
		char *key = strdup((const char *)kev.data.scalar.value);
		yaml_mark_t km = kev.start_mark;
		int merge = kev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE && strcmp(key, "<<") == 0;
		yaml_event_delete(&kev);
		if (merge) {
			fail_at(y, km, "merge keys (<<) are not YAML 1.2; write the keys out");
			free(key);
			goto fail;
		}
		if (json_object_get(obj, key)) {
			fail_at(y, km, "the key \"%s\" appears twice", key);
			free(key);
			goto fail;
		}
		if (next(y, &vev)) {
			free(key);
			goto fail;
		}
		json_t *v = node(y, &vev);
		yaml_event_delete(&vev);
		if (!v) {
			free(key);
			goto fail;
		}
		json_object_set_new(obj, key, v);
		free(key);
	}
fail:
	json_decref(obj);
	return NULL;
}

/* The value of the node ev starts (ev is the caller's to delete); its
 * anchor, if any, remembered for later aliases. */
static json_t *node(y2j *y, yaml_event_t *ev)
{
	json_t *v = NULL;
	const yaml_char_t *anc = NULL;
	switch (ev->type) {
	case YAML_ALIAS_EVENT:
		for (anchor *a = y->anchors; a; a = a->next)
			if (strcmp(a->name, (const char *)ev->data.alias.anchor) == 0)
				return json_incref(a->value);
		fail_at(y, ev->start_mark, "the alias *%s names no anchor before it", ev->data.alias.anchor);
		return NULL;
	case YAML_SCALAR_EVENT:
		anc = ev->data.scalar.anchor;
		v = scalar(y, ev);
		break;
	case YAML_SEQUENCE_START_EVENT:
		anc = ev->data.sequence_start.anchor;
		if (ev->data.sequence_start.tag && strcmp((const char *)ev->data.sequence_start.tag, TAG_PREFIX "seq")) {
			fail_at(y, ev->start_mark, "the tag %s has no JSON meaning", ev->data.sequence_start.tag);
			return NULL;
		}
		v = sequence(y);
		break;
	case YAML_MAPPING_START_EVENT:
		anc = ev->data.mapping_start.anchor;
		if (ev->data.mapping_start.tag && strcmp((const char *)ev->data.mapping_start.tag, TAG_PREFIX "map")) {
			fail_at(y, ev->start_mark, "the tag %s has no JSON meaning", ev->data.mapping_start.tag);
			return NULL;
		}
		v = mapping(y);
		break;
	default:
		fail_at(y, ev->start_mark, "unexpected YAML event");
		return NULL;
	}
	if (v && anc) {
		anchor *a = calloc(1, sizeof *a);
		a->name = strdup((const char *)anc);
		a->value = json_incref(v);
		a->next = y->anchors;
		y->anchors = a;
	}
	return v;
}

json_t *yaml2json_load(const char *buf, size_t len, char *err, size_t errn)
{
	y2j y = {.err = err, .errn = errn};
	json_t *doc = NULL;
	yaml_event_t ev;
	int have_ev = 0;
	snprintf(err, errn, "not YAML");
	if (!yaml_parser_initialize(&y.p))
		return NULL;
	yaml_parser_set_input_string(&y.p, (const unsigned char *)buf, len);
	/* STREAM-START, DOCUMENT-START, the root node, DOCUMENT-END, STREAM-END */
	if (next(&y, &ev))
		goto out;
	yaml_event_delete(&ev);
	if (next(&y, &ev))
		goto out;
	if (ev.type == YAML_STREAM_END_EVENT) {
		fail_at(&y, ev.start_mark, "the file holds no document");
		yaml_event_delete(&ev);
		goto out;
	}
	yaml_event_delete(&ev);
	if (next(&y, &ev))
		goto out;
	have_ev = 1;
	doc = node(&y, &ev);
	yaml_event_delete(&ev);
	have_ev = 0;
	if (!doc || next(&y, &ev)) /* DOCUMENT-END */
		goto fail;
	yaml_event_delete(&ev);
	if (next(&y, &ev))
		goto fail;
	have_ev = 1;
	if (ev.type != YAML_STREAM_END_EVENT) {
		fail_at(&y, ev.start_mark, "a second document: a spec file holds one");
		goto fail;
	}
	goto out;
fail:
	json_decref(doc);
	doc = NULL;
out:
	if (have_ev)
		yaml_event_delete(&ev);
	while (y.anchors) {
		anchor *a = y.anchors;
		y.anchors = a->next;
		free(a->name);
		json_decref(a->value);
		free(a);
	}
	yaml_parser_delete(&y.p);
	return doc;
}
