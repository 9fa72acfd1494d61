#!/usr/bin/env python3
"""render_jinja.py — the reference renderer for kiln's chat-template tests.

Renders chat templates with Python's jinja2 exactly as Hugging Face transformers' apply_chat_template
does: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension and a {% generation %} tag, HF's tojson (json.dumps, ensure_ascii=False), raise_exception and
strftime_now (formatting a fixed UTC time given as "now" so tests are deterministic).

usage: render_jinja.py JOBS.json RESULTS.json
  JOBS.json: {"now": SECONDS, "jobs": [{"template": PATH, "vars": {...}}, ...]}
  RESULTS.json: [{"ok": true, "text": "..."} | {"ok": false, "error": "..."}, ...] in job order
"""
import datetime
import json
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTag(Extension):
    """HF's AssistantTracker when not tracking: {% generation %} renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(now, tz=datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    env = make_env(spec.get("now", 1721995200))
    compiled = {}
    results = []
    for job in spec["jobs"]:
        path = job["template"]
        try:
            if path not in compiled:
                with open(path, encoding="utf-8", newline="") as f:
                    src = f.read()
                try:
                    compiled[path] = env.from_string(src)
                except Exception as e:  # keep the compile error for every job of this template
                    compiled[path] = e
            t = compiled[path]
            if isinstance(t, Exception):
                raise t
            results.append({"ok": True, "text": t.render(**job["vars"])})
        except Exception as e:
            results.append({"ok": False, "error": "%s: %s" % (type(e).__name__, e)})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
