// openai_client.cjs — kiln serve driven by the official `openai` npm client (tests/test_server.c runs it).
// usage: node openai_client.cjs PORT CHAT_PROMPT TEXT_PROMPT MAX_TOKENS
// Checks what can be checked from the client alone (streamed == plain, 4 concurrent streams == each alone,
// stop sequences, logprobs shape, the prompt cache of a second turn, usage and timings on every answer) and
// prints {"chat": text, "completion": text} for the C test to compare with `kiln run --temp 0`.
'use strict';
const mod = require('openai');
const OpenAI = mod.OpenAI || mod.default || mod;

const [port, chatPrompt, textPrompt, maxTokensArg] = process.argv.slice(2);
const maxTokens = parseInt(maxTokensArg, 10);
const client = new OpenAI({baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000});
const failures = [];
function check(cond, what) { if (!cond) failures.push(what); }

function checkTimings(t, what) {
  check(t && typeof t === 'object', `${what}: timings object`);
  if (!t) return;
  for (const k of ['queue_ms', 'template_ms', 'cache_n', 'prompt_n', 'prompt_ms', 'ttft_ms', 'predicted_n', 'predicted_ms'])
    check(typeof t[k] === 'number' && t[k] >= 0, `${what}: timings.${k} = ${t[k]}`);
}

async function chat(messages, extra = {}) {
  const r = await client.chat.completions.create({model: 'kiln', messages, max_tokens: maxTokens, temperature: 0, ...extra});
  check(r.object === 'chat.completion' && r.choices.length === 1, 'chat: object and one choice');
  check(r.usage && r.usage.completion_tokens >= 1 && r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens, 'chat: usage');
  checkTimings(r.timings, 'chat');
  return r;
}

async function chatStream(messages) {
  const s = await client.chat.completions.create({model: 'kiln', messages, max_tokens: maxTokens, temperature: 0,
                                                 stream: true, stream_options: {include_usage: true}});
  let text = '', finish = null, usage = null, timings = null, role = null;
  for await (const ch of s) {
    if (ch.choices.length) {
      const d = ch.choices[0].delta;
      if (d.role) role = d.role;
      text += d.content || '';
      if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
    }
    if (ch.usage) usage = ch.usage;
    if (ch.timings) timings = ch.timings;
  }
  check(role === 'assistant', 'chat stream: role');
  check(finish === 'stop' || finish === 'length', `chat stream: finish_reason ${finish}`);
  check(usage && usage.completion_tokens >= 1, 'chat stream: usage in the last chunk');
  checkTimings(timings, 'chat stream');
  return {text, finish, usage};
}

async function complete(prompt, extra = {}) {
  const r = await client.completions.create({model: 'kiln', prompt, max_tokens: maxTokens, temperature: 0, ...extra});
  check(r.object === 'text_completion' && r.choices.length === 1, 'completion: object and one choice');
  checkTimings(r.timings, 'completion');
  return r;
}

async function completeStream(prompt) {
  const s = await client.completions.create({model: 'kiln', prompt, max_tokens: maxTokens, temperature: 0, stream: true});
  let text = '', finish = null;
  for await (const ch of s) {
    if (ch.choices.length) {
      text += ch.choices[0].text || '';
      if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
    }
  }
  check(finish === 'stop' || finish === 'length', `completion stream: finish_reason ${finish}`);
  return text;
}

async function main() {
  const models = await client.models.list();
  const ids = [];
  for await (const m of models) ids.push(m.id);
  check(ids.length === 1 && ids[0].endsWith('.gguf'), `models: ${JSON.stringify(ids)}`);

  const msgs = [{role: 'user', content: chatPrompt}];
  const plain = await chat(msgs);
  const chatText = plain.choices[0].message.content;
  const streamed = await chatStream(msgs);
  check(streamed.text === chatText, `chat: streamed text differs\n  plain:    ${JSON.stringify(chatText)}\n  streamed: ${JSON.stringify(streamed.text)}`);
  // the array-of-parts content form gives the same prompt
  const parts = await chat([{role: 'user', content: [{type: 'text', text: chatPrompt}]}]);
  check(parts.choices[0].message.content === chatText, 'chat: content parts differ from string content');

  const comp = await complete(textPrompt);
  const compText = comp.choices[0].text;
  const compStream = await completeStream(textPrompt);
  check(compStream === compText, `completion: streamed text differs\n  plain:    ${JSON.stringify(compText)}\n  streamed: ${JSON.stringify(compStream)}`);

  // stop: the text up to the stop sequence, without it
  const words = compText.trim().split(/\s+/);
  if (words.length > 4) {
    const stop = ' ' + words[3];
    const cut = compText.indexOf(stop);
    const st = await complete(textPrompt, {stop: [stop, '@@never@@']});
    check(st.choices[0].text === compText.slice(0, cut), `stop: ${JSON.stringify(st.choices[0].text)} != ${JSON.stringify(compText.slice(0, cut))}`);
    check(st.choices[0].finish_reason === 'stop', 'stop: finish_reason');
  }

  // logprobs: one entry per token, the greedy token is the most likely one
  const lp = await chat(msgs, {logprobs: true, top_logprobs: 3});
  const content = lp.choices[0].logprobs && lp.choices[0].logprobs.content;
  check(Array.isArray(content) && content.length >= 1 && content.length <= lp.usage.completion_tokens, 'logprobs: content');
  for (const e of content || []) {
    check(typeof e.token === 'string' && e.logprob <= 0 && e.top_logprobs.length === 3, 'logprobs: entry shape');
    check(Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-5, `logprobs: greedy token ${e.token} is not the top one`);
  }
  check(lp.choices[0].message.content === chatText, 'logprobs: text differs from the plain answer');

  // a second turn reuses the first turn's tokens from the slot's cache
  const turn2 = await chat([...msgs, {role: 'assistant', content: chatText}, {role: 'user', content: 'And then?'}]);
  const cached = turn2.usage.prompt_tokens_details.cached_tokens;
  check(cached >= plain.usage.prompt_tokens - 1, `prompt cache: second turn reused ${cached} tokens, first prompt had ${plain.usage.prompt_tokens}`);
  check(turn2.timings.cache_n === cached, 'prompt cache: timings.cache_n');

  // 4 concurrent streams give each the text it gets alone
  const prompts = ['The dog', 'A little girl', 'Tom and Sue went', 'One day the sun'];
  const alone = [];
  for (const p of prompts) alone.push((await chatStream([{role: 'user', content: p}])).text);
  const together = await Promise.all(prompts.map(p => chatStream([{role: 'user', content: p}])));
  prompts.forEach((p, i) => check(together[i].text === alone[i], `concurrent: ${JSON.stringify(p)} gave ${JSON.stringify(together[i].text)} together, ${JSON.stringify(alone[i])} alone`));

  console.log(JSON.stringify({chat: chatText, completion: compText, cached, failures}));
  if (failures.length) {
    console.error('FAILED:\n' + failures.join('\n'));
    process.exit(1);
  }
}

main().catch(e => { console.error('error: ' + (e && e.stack || e)); process.exit(2); });
