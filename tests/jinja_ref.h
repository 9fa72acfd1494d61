/* jinja_ref.h — the chat-template tests' reference: Python's jinja2 through tests/render_jinja.py. */
#ifndef KILN_TESTS_JINJA_REF_H
#define KILN_TESTS_JINJA_REF_H

#include <jansson.h>

/* The time strftime_now() formats in both kiln's and the reference's renderings: 2024-07-26 12:00:00 UTC. */
#define JINJA_REF_NOW 1721995200

/* Renders every job of `jobs` (an array of {template, vars} objects, see tests/render_jinja.py) with jinja2;
 * returns the results array, one entry per job (a new reference), or NULL after failing the test. */
json_t *jinja_ref_render(json_t *jobs);

#endif
