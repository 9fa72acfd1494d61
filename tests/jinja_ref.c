/* jinja_ref.c — runs tests/render_jinja.py (Python's jinja2) over a batch of template jobs for the
 * chat-template tests. */
#include "jinja_ref.h"

#include <stdio.h>
#include <stdlib.h>

#include "test.h"

json_t *jinja_ref_render(json_t *jobs) {
    char jobs_path[1024], res_path[1024], cmd[4096];
    snprintf(jobs_path, sizeof jobs_path, "%s/jobs.json", test_tmpdir());
    snprintf(res_path, sizeof res_path, "%s/results.json", test_tmpdir());
    json_t *spec = json_pack("{s:i, s:O}", "now", (json_int_t)JINJA_REF_NOW, "jobs", jobs);
    int wrc = json_dump_file(spec, jobs_path, JSON_COMPACT);
    json_decref(spec);
    if (wrc) { test_failf(__FILE__, __LINE__, "cannot write %s", jobs_path); return NULL; }
    snprintf(cmd, sizeof cmd, "%s tests/render_jinja.py '%s' '%s' 2>&1", test_python_jinja(), jobs_path, res_path);
    char *out = NULL;
    int rc = test_run_cmd(cmd, &out);
    if (rc != 0) {
        test_failf(__FILE__, __LINE__, "the jinja2 reference failed (python3 with jinja2 is required): rc %d: %s", rc,
                   out ? out : "");
        free(out);
        return NULL;
    }
    free(out);
    json_error_t err;
    json_t *res = json_load_file(res_path, 0, &err);
    if (!json_is_array(res) || json_array_size(res) != json_array_size(jobs)) {
        test_failf(__FILE__, __LINE__, "bad results file %s: %s", res_path, res ? "not one result per job" : err.text);
        json_decref(res);
        return NULL;
    }
    return res;
}
