// The official openai client against a running `kite serve` (started by run.sh, which sets
// KITE_URL and KITE_API_KEY). Every check looks at the fields a client would use.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const baseURL = process.env.KITE_URL + '/v1';
const apiKey = process.env.KITE_API_KEY;
assert.ok(process.env.KITE_URL, 'KITE_URL must be set (run through tests/openai/run.sh)');
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30000 });

async function modelId() {
  const list = await client.models.list();
  return list.data[0].id;
}

const messages = [
  { role: 'system', content: 'You are a poet.' },
  { role: 'user', content: 'Tell me about the king.' },
];

test('models.list names the served model', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].id, 'llama-target');
  assert.equal(list.data[0].object, 'model');
  const one = await client.models.retrieve('llama-target');
  assert.equal(one.id, 'llama-target');
});

test('chat completion, streamed and not, agree (greedy) with exact usage', async () => {
  const model = await modelId();
  const whole = await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0 });
  assert.equal(whole.object, 'chat.completion');
  assert.equal(whole.model, model);
  assert.match(whole.system_fingerprint, /^fp_[0-9a-f]{16}$/);
  assert.equal(whole.choices.length, 1);
  const choice = whole.choices[0];
  assert.equal(choice.message.role, 'assistant');
  assert.equal(typeof choice.message.content, 'string');
  assert.ok(['stop', 'length'].includes(choice.finish_reason));
  assert.ok(whole.usage.prompt_tokens > 5);
  assert.ok(whole.usage.completion_tokens >= 1 && whole.usage.completion_tokens <= 10);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);

  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 10, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  let role = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(text, choice.message.content);
  assert.equal(finish, choice.finish_reason);
  assert.deepEqual(
    [usage.prompt_tokens, usage.completion_tokens],
    [whole.usage.prompt_tokens, whole.usage.completion_tokens],
  );
});

test('chat: n, seed, logprobs and top_logprobs', async () => {
  const model = await modelId();
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 6, temperature: 0.9, seed: 11, n: 2, logprobs: true, top_logprobs: 3,
  });
  assert.equal(r.choices.length, 2);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  for (const c of r.choices) {
    assert.ok(c.logprobs.content.length >= 1);
    for (const lp of c.logprobs.content) {
      assert.equal(typeof lp.token, 'string');
      assert.ok(lp.logprob <= 0);
      assert.equal(lp.top_logprobs.length, 3);
      assert.ok(lp.top_logprobs[0].logprob >= lp.top_logprobs[2].logprob);
    }
  }
  const again = await client.chat.completions.create({
    model, messages, max_tokens: 6, temperature: 0.9, seed: 11, n: 2,
  });
  assert.equal(again.choices[0].message.content, r.choices[0].message.content);
});

test('completions: string prompt, echo, logprobs, stop', async () => {
  const model = await modelId();
  const r = await client.completions.create({
    model, prompt: 'Once upon a time', max_tokens: 5, temperature: 0, echo: true, logprobs: 2,
  });
  assert.equal(r.object, 'text_completion');
  assert.ok(r.choices[0].text.startsWith('Once upon a time'));
  // echo: the prompt's tokens (the BOS the tokenizer added is not echoed) come first, then the generated ones.
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.join(''), r.choices[0].text);
  assert.equal(lp.tokens.length, r.usage.prompt_tokens - 1 + r.usage.completion_tokens);
  assert.equal(lp.text_offset[r.usage.prompt_tokens - 1], 'Once upon a time'.length);
  assert.ok(lp.token_logprobs.every((x) => typeof x === 'number' && x <= 0));
  assert.equal(lp.top_logprobs[0] && Object.keys(lp.top_logprobs[0]).length, 2);
  // max_tokens 0 with echo scores the prompt alone.
  const scored = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 0, echo: true, logprobs: 1 });
  assert.equal(scored.choices[0].text, 'Once upon a time');
  assert.equal(scored.usage.completion_tokens, 0);
  assert.deepEqual(scored.choices[0].logprobs.token_logprobs, lp.token_logprobs.slice(0, r.usage.prompt_tokens - 1));
  const s = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 40, temperature: 0, stop: ['\n'] });
  assert.ok(!s.choices[0].text.includes('\n'));

  const stream = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 5, temperature: 0, stream: true });
  let text = '';
  for await (const chunk of stream) for (const c of chunk.choices) text += c.text;
  const whole = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
  assert.equal(text, whole.choices[0].text);
});

test('response_format json_schema output parses and follows the schema', async () => {
  const model = await modelId();
  const schema = {
    type: 'object',
    properties: { verdict: { type: 'string', enum: ['guilty', 'innocent'] }, years: { type: 'integer' } },
    required: ['verdict', 'years'],
  };
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 120, temperature: 0,
    response_format: { type: 'json_schema', json_schema: { name: 'verdict', schema, strict: true } },
  });
  assert.equal(r.choices[0].finish_reason, 'stop');
  const out = JSON.parse(r.choices[0].message.content);
  assert.ok(['guilty', 'innocent'].includes(out.verdict));
  assert.ok(Number.isInteger(out.years));
  const anyJson = await client.chat.completions.create({
    model, messages, max_tokens: 30, temperature: 0, response_format: { type: 'json_object' },
  });
  const text = anyJson.choices[0].message.content;
  if (anyJson.choices[0].finish_reason === 'stop') JSON.parse(text);
  else assert.match(text, /^\s*[[{"\-0-9tfn]/);  // cut short, but a JSON value has begun
});

test('tools are accepted; the answer is content or well-formed tool calls', async () => {
  const model = await modelId();
  const tools = [{
    type: 'function',
    function: { name: 'get_weather', description: 'Weather of a city', parameters: { type: 'object', properties: { city: { type: 'string' } } } },
  }];
  const r = await client.chat.completions.create({ model, messages, tools, max_tokens: 8, temperature: 0 });
  const c = r.choices[0];
  if (c.message.tool_calls) {
    assert.equal(c.finish_reason, 'tool_calls');
    for (const t of c.message.tool_calls) JSON.parse(t.function.arguments);
  } else {
    assert.equal(typeof c.message.content, 'string');
  }
});

test('tool_choice required: the model is made to call a tool, parsed into tool_calls', async () => {
  const model = await modelId();
  const tools = [
    { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'] } } },
    { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
  ];
  const r = await client.chat.completions.create({
    model, messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 200, temperature: 0,
  });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.content, null);
  assert.equal(c.message.tool_calls.length, 1);
  const call = c.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.equal(typeof JSON.parse(call.function.arguments).city, 'string');
  assert.ok(call.id.length > 0);

  // Streamed, the call arrives as a tool_calls delta.
  const stream = await client.chat.completions.create({
    model, messages, tools, tool_choice: 'required', max_tokens: 200, temperature: 0, stream: true,
  });
  let calls = [];
  let finish = null;
  for await (const chunk of stream) for (const ch of chunk.choices) {
    if (ch.delta.tool_calls) calls = calls.concat(ch.delta.tool_calls);
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(calls.length, 1);
  assert.ok(['get_weather', 'get_time'].includes(calls[0].function.name));
  JSON.parse(calls[0].function.arguments);

  // The conversation goes on with the tool's result.
  const next = await client.chat.completions.create({
    model, max_tokens: 5, temperature: 0,
    messages: [...messages, c.message, { role: 'tool', tool_call_id: call.id, content: '{"temp": 21}' }],
  });
  assert.equal(typeof next.choices[0].message.content, 'string');
  await expectError(client.chat.completions.create({
    model, messages, tools, tool_choice: { type: 'function', function: { name: 'nope' } },
  }), 400, 'tool_choice');
});

async function expectError(promise, status, param) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof OpenAI.APIError, `expected an APIError, got ${e}`);
    assert.equal(e.status, status);
    if (param !== undefined) assert.equal(e.param, param);
    assert.ok(e.message.length > 0);
    return true;
  });
}

test('errors: bad fields give 400 naming the field; unknown model 404; bad key 401', async () => {
  const model = await modelId();
  await expectError(client.chat.completions.create({ model, messages, temperature: 5 }), 400, 'temperature');
  await expectError(client.chat.completions.create({ model, messages, n: 0 }), 400, 'n');
  await expectError(client.chat.completions.create({ model, messages, max_tokens: -5 }), 400, 'max_tokens');
  await expectError(client.chat.completions.create({ model, messages: [] }), 400, 'messages');
  await expectError(client.chat.completions.create({ model, messages: [{ role: 'robot', content: 'x' }] }), 400, 'messages[0].role');
  await expectError(client.chat.completions.create({ model, messages, stop: 7 }), 400, 'stop');
  await expectError(client.chat.completions.create({ model, messages, logit_bias: { 'abc': 1 } }), 400, 'logit_bias');
  await expectError(client.completions.create({ model, prompt: 12 }), 400, 'prompt');
  await expectError(client.chat.completions.create({ model: 'gpt-4o', messages }), 404, 'model');
  await expectError(client.models.retrieve('gpt-4o'), 404);
  const bad = new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0 });
  await expectError(bad.models.list(), 401);
  await expectError(client.embeddings.create({ model, input: '' }), 400, 'input');
  await expectError(client.embeddings.create({ model, input: 'hello', dimensions: 3 }), 400, 'dimensions');
  await expectError(client.embeddings.create({ model, input: 'x'.repeat(20000) }), 400, 'input');
});

function cosine(a, b) {
  let d = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) { d += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i]; }
  return d / Math.sqrt(na * nb);
}

test('embeddings.create: base64 (the client default) and float agree with `kite embed` and transformers', async () => {
  const model = await modelId();
  // ctest sets KITE_EXE and KITE_MODEL_DIR (the served model): `kite embed` of the same sentences
  // and transformers' vectors in reference.json are what the server must agree with.
  assert.ok(process.env.KITE_EXE && process.env.KITE_MODEL_DIR, 'KITE_EXE and KITE_MODEL_DIR must be set (ctest does)');
  const dir = process.env.KITE_MODEL_DIR;
  const ref = JSON.parse(readFileSync(dir + '/reference.json', 'utf8')).embeddings;
  const input = ref.map((e) => e.text);
  const cli = JSON.parse(execFileSync(process.env.KITE_EXE, ['embed', '-m', dir, '--json', ...input], { encoding: 'utf8' }));
  const r = await client.embeddings.create({ model, input });  // the client asks for base64 and decodes it
  assert.equal(r.object, 'list');
  assert.equal(r.model, model);
  assert.equal(r.data.length, input.length);
  assert.equal(cli.dim, r.data[0].embedding.length);
  assert.ok(r.usage.prompt_tokens >= input.length * 2);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
  for (let i = 0; i < input.length; i++) {
    const v = r.data[i].embedding;
    assert.equal(r.data[i].index, i);
    assert.equal(r.data[i].object, 'embedding');
    assert.ok(Math.abs(Math.hypot(...v) - 1) < 1e-5, `norm of ${i}`);
    assert.ok(cosine(v, ref[i].embedding) > 0.9999, `input ${i} vs transformers`);
    const maxDiff = Math.max(...v.map((x, k) => Math.abs(x - cli.data[i][k])));
    assert.ok(maxDiff < 1e-5, `input ${i} vs kite embed: max diff ${maxDiff}`);
  }
  const f = await client.embeddings.create({ model, input: input[0], encoding_format: 'float' });
  assert.equal(f.data.length, 1);
  assert.ok(f.data[0].embedding.every((x, k) => Math.abs(x - r.data[0].embedding[k]) < 1e-7));
});
