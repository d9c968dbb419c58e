// The official OpenAI Node SDK against txl-server's HTTP port: completions
// and chat completions, whole and streamed, and an error. Run by
// test_openai_sdk.py with TXL_BASE_URL and the SDK installed beside it.
import assert from "node:assert/strict";
import OpenAI from "openai";

const client = new OpenAI({baseURL: process.env.TXL_BASE_URL, apiKey: "unused", maxRetries: 0});
const model = (await client.models.list()).data[0].id;

const whole = await client.completions.create({model, prompt: "ROMEO:", max_tokens: 12, temperature: 0});
assert.equal(whole.object, "text_completion");
assert.equal(whole.choices[0].finish_reason, "length");
assert.equal(whole.usage.completion_tokens, 12);

let streamed = "", usage = null, chunks = 0;
const stream = await client.completions.create({model, prompt: "ROMEO:", max_tokens: 12, temperature: 0, stream: true,
                                                stream_options: {include_usage: true}});
for await (const chunk of stream) {
  chunks++;
  if (chunk.choices.length) streamed += chunk.choices[0].text;
  if (chunk.usage) usage = chunk.usage;
}
assert.equal(streamed, whole.choices[0].text);
assert.ok(chunks > 2);
assert.equal(usage.total_tokens, 6 + 12);

const chat = await client.chat.completions.create({model, max_tokens: 8, temperature: 0,
                                                   messages: [{role: "user", content: "Speak."}]});
assert.equal(chat.choices[0].message.role, "assistant");
let chatStreamed = "";
for await (const chunk of await client.chat.completions.create({model, max_tokens: 8, temperature: 0, stream: true,
                                                                messages: [{role: "user", content: "Speak."}]})) {
  chatStreamed += chunk.choices[0]?.delta?.content ?? "";
}
assert.equal(chatStreamed, chat.choices[0].message.content);

// The session extension passes through the SDK as an extra body field.
const session = await client.post("/sessions", {body: {}});
const first = await client.completions.create({model, prompt: "ROMEO:", max_tokens: 4, temperature: 0,
                                               session_id: session.id});
assert.equal(first.session_id, session.id);
assert.equal(first.position, 10);

await assert.rejects(client.completions.create({model, prompt: "x", n: 2}),
                     (e) => e.status === 400 && e.error?.param === "n");
console.log(JSON.stringify({ok: true, text: whole.choices[0].text, chunks}));
