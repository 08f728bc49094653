// The chat page at `/` in headless Chromium against a running `kite serve` (started by
// tests/serve-and-run.sh, which sets KITE_URL and KITE_API_KEY): it loads, sends what the user
// typed, shows the reply as it streams, keeps the conversation, and shows errors.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';

const url = process.env.KITE_URL;
const key = process.env.KITE_API_KEY;
assert.ok(url, 'KITE_URL must be set (run through tests/browser/run.sh)');

let browser;
before(async () => {
  browser = await chromium.launch({ executablePath: process.env.KITE_CHROMIUM, headless: true });
});
after(async () => {
  if (browser) await browser.close();
});

// Opens the page with the given API key, greedy decoding and a short reply length; every update
// of an assistant reply's text is recorded, to tell a streamed reply from one that arrives whole.
async function openPage(apiKey) {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  const res = await page.goto(url + '/');
  assert.equal(res.status(), 200);
  assert.match(res.headers()['content-type'], /text\/html/);
  await page.fill('#key', apiKey);
  await page.fill('#temp', '0');
  await page.fill('#max', '24');
  await page.evaluate(() => {
    window.kiteUpdates = [];
    new MutationObserver((records) => {
      for (const r of records) {
        const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
        if (el && el.classList.contains('assistant')) window.kiteUpdates.push(el.textContent.length);
      }
    }).observe(document.getElementById('log'), { childList: true, characterData: true, subtree: true });
  });
  return { page, errors };
}

async function send(page, text, replyIndex) {
  await page.fill('#input', text);
  await page.click('#send');
  const reply = page.locator(`#reply-${replyIndex}[data-done="1"]`);
  await reply.waitFor({ timeout: 60000 });
  return { text: await reply.textContent(), cls: await reply.getAttribute('class') };
}

async function greedyReply(messages) {
  const r = await fetch(url + '/v1/chat/completions', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: 'Bearer ' + key },
    body: JSON.stringify({ messages, max_tokens: 24, temperature: 0 }),
  });
  assert.equal(r.status, 200);
  return (await r.json()).choices[0].message.content;
}

test('the page streams a reply equal to the non-streamed one, and keeps the conversation', async () => {
  const { page, errors } = await openPage(key);
  const first = await send(page, 'Tell me about the king.', 1);
  assert.equal(first.cls, 'msg assistant');
  assert.ok(first.text.length > 0, 'the reply is empty');
  assert.equal(await page.textContent('#model'), 'llama-target');
  const updates = await page.evaluate(() => window.kiteUpdates);
  assert.ok(new Set(updates.filter((n) => n > 0)).size >= 2, `the reply did not stream: updates ${updates}`);
  const history = [{ role: 'user', content: 'Tell me about the king.' }];
  assert.equal(first.text, await greedyReply(history));

  // The second turn sends the whole conversation.
  const second = await send(page, 'And the queen?', 3);
  assert.equal(second.cls, 'msg assistant');
  history.push({ role: 'assistant', content: first.text }, { role: 'user', content: 'And the queen?' });
  assert.equal(second.text, await greedyReply(history));
  assert.equal(await page.locator('.msg.user').count(), 2);
  assert.deepEqual(errors, []);
  await page.close();
});

test('a wrong API key shows the server error in the page', async () => {
  const { page, errors } = await openPage('not-the-key');
  const reply = await send(page, 'Hello', 1);
  assert.equal(reply.cls, 'msg error');
  assert.match(reply.text, /^error: .*API key/i);
  assert.deepEqual(errors, []);
  await page.close();
});
