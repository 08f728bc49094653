// The chat page served at GET / : static HTML + JS, embedded in the binary. It streams replies
// from /v1/chat/completions (Server-Sent Events over fetch).
#include "tools/server/http.h"

namespace kite::tools::server {

const char* chat_page_html() {
  return R"KITEHTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>kite chat</title>
<style>
body{font-family:system-ui,sans-serif;max-width:760px;margin:0 auto;padding:1em;background:#fafafa}
#log{border:1px solid #ccc;background:#fff;min-height:300px;padding:.5em;overflow-y:auto;max-height:70vh}
.msg{margin:.4em 0;white-space:pre-wrap}.user{color:#0645ad}.assistant{color:#222}.error{color:#b00}
form{display:flex;gap:.5em;margin-top:.5em}#input{flex:1;padding:.4em}
#settings{margin:.5em 0;font-size:.9em;color:#555}
</style></head><body>
<h1>kite</h1>
<div id="settings">model: <span id="model">?</span> &middot;
 API key: <input id="key" type="password" size="16"> &middot;
 max tokens: <input id="max" type="number" value="256" min="1" style="width:5em"> &middot;
 temperature: <input id="temp" type="number" value="0.7" step="0.1" min="0" max="2" style="width:4em"></div>
<div id="log"></div>
<form id="form"><input id="input" autocomplete="off" placeholder="Say something"><button id="send">Send</button></form>
<script>
const log = document.getElementById('log');
const history = [];
function headers() {
  const h = {'Content-Type': 'application/json'};
  const k = document.getElementById('key').value;
  if (k) h['Authorization'] = 'Bearer ' + k;
  return h;
}
function add(cls, text) {
  const d = document.createElement('div');
  d.className = 'msg ' + cls; d.textContent = text; log.appendChild(d); log.scrollTop = log.scrollHeight;
  return d;
}
let modelId = null;
async function loadModel() {
  try {
    const r = await fetch('/v1/models', {headers: headers()});
    const j = await r.json();
    if (j.data && j.data.length) { modelId = j.data[0].id; document.getElementById('model').textContent = modelId; }
  } catch (e) {}
}
loadModel();
document.getElementById('form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const input = document.getElementById('input');
  const text = input.value.trim();
  if (!text) return;
  input.value = '';
  history.push({role: 'user', content: text});
  add('user', text);
  const out = add('assistant', '');
  out.id = 'reply-' + history.length;
  let reply = '';
  try {
    if (!modelId) await loadModel();
    const body = {messages: history, stream: true,
                  max_tokens: parseInt(document.getElementById('max').value) || 256,
                  temperature: parseFloat(document.getElementById('temp').value)};
    if (modelId) body.model = modelId;
    const r = await fetch('/v1/chat/completions', {method: 'POST', headers: headers(), body: JSON.stringify(body)});
    if (!r.ok) { const j = await r.json(); throw new Error(j.error ? j.error.message : r.statusText); }
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const line = buf.slice(0, i); buf = buf.slice(i + 2);
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        for (const c of j.choices || []) if (c.delta && c.delta.content) { reply += c.delta.content; out.textContent = reply; }
      }
    }
    history.push({role: 'assistant', content: reply});
    out.dataset.done = '1';
  } catch (e) {
    out.className = 'msg error'; out.textContent = 'error: ' + e.message; out.dataset.done = '1';
  }
});
</script></body></html>
)KITEHTML";
}

}  // namespace kite::tools::server
