/* yaml2json — a job or dataset spec written in YAML, as the JSON the API
 * takes. Plain scalars are typed by the YAML 1.2 core schema; anything JSON
 * cannot hold (.inf, .nan, a second document, a non-scalar key, a merge
 * key, a tag other than the core ones) is refused with its line and column,
 * never guessed. Must never print or exit: the caller reports the error. */
#ifndef BERTD_CLIENT_YAML2JSON_H
#define BERTD_CLIENT_YAML2JSON_H

#include <stddef.h>

#include <jansson.h>

/* Parses buf[0..len) as one YAML document. Returns its value (caller owns:
 * one json_decref), or NULL with "line L, column C: why" (1-based) in
 * err[0..errn). Mappings become objects (a key repeated is an error),
 * sequences arrays, aliases the value of their anchor. */
json_t *yaml2json_load(const char *buf, size_t len, char *err, size_t errn);

#endif
