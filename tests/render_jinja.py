#!/usr/bin/env python3
"""render_jinja.py — the reference renderer for kiln's chat-template tests.

Renders chat templates with Python's jinja2 exactly as Hugging Face transformers' apply_chat_template
does: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension and a {% generation %} tag, HF's tojson (json.dumps, ensure_ascii=False), raise_exception and
strftime_now (formatting a fixed UTC time given as "now" so tests are deterministic).

usage: render_jinja.py JOBS.json RESULTS.json
  JOBS.json: {"now": SECONDS, "jobs": [{"template": PATH, "vars": {...}}, ...]}
  RESULTS.json: [{"ok": true, "text": "..."} | {"ok": false, "error": "..."}, ...] in job order
usage: render_jinja.py --random-conversations SEED N OUT.json
  writes N pseudo-random conversations (template variables) drawn deterministically from SEED: system
  prompts, user/assistant/tool turns, tool calls with object or string arguments, null contents,
  reasoning_content, tools, documents, enable_thinking, special-token and non-ASCII text.
"""
import datetime
import json
import random
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


TEXTS = ["Hello", "", " ", "  spaced  ", "line1\nline2\n", "<|im_end|>", "</s><s>", "[INST] x [/INST]",
         "<think>r</think>ans", "<think>\nr\n</think>\n\nans", "Gr\u00fc\u00dfe \u4e16\u754c \U0001F600",
         "quote ' \" \\ end", "{{ x }} {% if %}", "tab\there", "/no_think", "/think", "\u00fcmlaut \u00df",
         "\u2028sep", "<tool_call>\n{}\n</tool_call>", "9", "None", "a" * 50]


def random_conversations(seed, n):
    rng = random.Random(seed)

    def text():
        return "".join(rng.choice(TEXTS) for _ in range(rng.randint(1, 3)))

    def args():
        d = {"city": text(), "n": rng.choice([1, 2.5, -3, 1e-7, True, None, [1, "a"], {"k": "v"}])}
        return json.dumps(d, ensure_ascii=False) if rng.random() < 0.3 else d

    def message(role):
        m = {"role": role}
        if role == "assistant" and rng.random() < 0.25:
            m["content"] = rng.choice([None, "", text()])
            m["tool_calls"] = [{"id": "call%05d" % rng.randint(0, 99999) + "ab"[:rng.randint(0, 2)], "type": "function",
                                "function": {"name": rng.choice(["get_weather", "search", "f"]), "arguments": args()}}
                               for _ in range(rng.randint(1, 2))]
        else:
            m["content"] = text()
        if role == "assistant" and rng.random() < 0.3:
            m["reasoning_content"] = text()
        if role == "tool":
            if rng.random() < 0.7:
                m["tool_call_id"] = "call%05d" % rng.randint(0, 99999)
            if rng.random() < 0.5:
                m["name"] = "get_weather"
        return m

    out = []
    for _ in range(n):
        msgs = [message("system")] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 6)):
            roles = ["user", "assistant"] if rng.random() < 0.8 else ["system", "user", "assistant", "tool"]
            msgs.append(message(rng.choice(roles)))
        v = {"messages": msgs, "add_generation_prompt": rng.random() < 0.5,
             "bos_token": rng.choice(["<s>", "", "<|begin_of_text|>"]), "eos_token": rng.choice(["</s>", "<|im_end|>", ""]),
             "tools": None, "documents": None}
        if rng.random() < 0.3:
            v["tools"] = [{"type": "function", "function": {"name": "get_weather", "description": text(), "parameters": {
                "type": "object", "properties": {"city": {"type": "string", "description": text()}, "n": {"type": "number"}},
                "required": ["city"]}}}]
        if rng.random() < 0.3:
            v["enable_thinking"] = rng.random() < 0.5
        if rng.random() < 0.1:
            v["documents"] = [{"doc_id": 1, "title": "T", "text": text()}]
        out.append(v)
    return out


def main():
    if sys.argv[1] == "--random-conversations":
        with open(sys.argv[4], "w", encoding="utf-8") as f:
            json.dump(random_conversations(int(sys.argv[2]), int(sys.argv[3])), f, ensure_ascii=False)
        return
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
