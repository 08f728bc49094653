// Load generator for OpenAI-compatible servers (kite serve, llama-server): C concurrent clients,
// each sending streaming /v1/completions requests back to back until R requests are done.
// Prints throughput and p50/p99 time-to-first-token and inter-token latency as one JSON line.
//   node bench/serve-load.mjs URL CONCURRENCY REQUESTS MAX_TOKENS [PROMPT_TOKENS]
// Prompts are token ids (distinct per request, so no prefix sharing) and greedy, with
// ignore_eos, so both servers do the same work. Needs Node >= 18 (fetch); no packages.
// SERVE_LOAD_TRACE=FILE also writes one line per request (start, first token and end in ms
// from the run's start): whether arrivals and first tokens are spread out or in lock step.
const [url, conc, total, maxTokens, promptLen = "16"] = process.argv.slice(2);
if (!url || !conc || !total || !maxTokens) {
  console.error("usage: node bench/serve-load.mjs URL CONCURRENCY REQUESTS MAX_TOKENS [PROMPT_TOKENS]");
  process.exit(2);
}
const C = Number(conc), R = Number(total), N = Number(maxTokens), P = Number(promptLen);

const ttft = [], gaps = [], trace = [];
let next = 0, tStart = 0;

async function one(i) {
  const prompt = Array.from({ length: P }, (_, k) => 100 + ((i * 131 + k * 17) % 3000));
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: N, temperature: 0, stream: true, ignore_eos: true }),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  let last = 0, buf = "";
  const decoder = new TextDecoder();
  for await (const chunk of res.body) {
    buf += decoder.decode(chunk, { stream: true });
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (!line.startsWith("data:") || line.includes("[DONE]")) continue;
      const ev = JSON.parse(line.slice(5));
      if (!ev.choices || ev.choices.length === 0) continue;
      const now = performance.now();
      if (last === 0) {
        ttft.push(now - t0);
        trace.push({ i, start: +(t0 - tStart).toFixed(1), first: +(now - tStart).toFixed(1), end: 0 });
      }
      else gaps.push(now - last);
      last = now;
    }
  }
  const rec = trace.find((r) => r.i === i);
  if (rec) rec.end = +(performance.now() - tStart).toFixed(1);
}

async function client() {
  for (let i = next++; i < R; i = next++) await one(i);
}

const pct = (v, p) => {
  if (v.length === 0) return 0;
  const s = [...v].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const t0 = performance.now();
tStart = t0;
await Promise.all(Array.from({ length: C }, client));
const secs = (performance.now() - t0) / 1000;
console.log(JSON.stringify({
  concurrency: C, requests: R, max_tokens: N, prompt_tokens: P, seconds: +secs.toFixed(2),
  tokens_per_s: +((R * N) / secs).toFixed(1),  // ignore_eos: every request generates N tokens
  ttft_ms_p50: +pct(ttft, 50).toFixed(0), ttft_ms_p99: +pct(ttft, 99).toFixed(0),
  itl_ms_p50: +pct(gaps, 50).toFixed(1), itl_ms_p99: +pct(gaps, 99).toFixed(1),
}));
if (process.env.SERVE_LOAD_TRACE) {
  const { writeFileSync } = await import("node:fs");
  trace.sort((a, b) => a.start - b.start);
  writeFileSync(process.env.SERVE_LOAD_TRACE, trace.map((r) => JSON.stringify(r)).join("\n") + "\n");
}
