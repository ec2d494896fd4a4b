// ember's chat page: conversations kept in this browser's local storage,
// replies streamed from /v1/chat/completions as any OpenAI client reads them
// (and read again from /v1/stream when a reload cuts one short).
"use strict";

const STORE = "ember.conversations";
const CURRENT = "ember.current";
const SETTINGS = "ember.settings";
const DEFAULTS = { system: "", temperature: 0.8, maxTokens: "", thinking: true, apiKey: "" };

const $ = (id) => document.getElementById(id);
// The path the server's routes sit under (its --api-prefix; empty at the root).
const API = document.querySelector('meta[name="ember-api-prefix"]').content;
let conversations = load(STORE, []);
let current = conversations.find((c) => c.id === localStorage.getItem(CURRENT)) || null;
let settings = { ...DEFAULTS, ...load(SETTINGS, {}) };
let controller = null;
let thinkingSwitch = false;

function load(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v === null ? fallback : v;
  } catch {
    return fallback;
  }
}

function persist() {
  localStorage.setItem(STORE, JSON.stringify(conversations));
  localStorage.setItem(CURRENT, current ? current.id : "");
}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (settings.apiKey) h.Authorization = "Bearer " + settings.apiKey;
  return h;
}

// Model output is Markdown; what it renders to is sanitised before it is shown.
function markdown(text) {
  if (!window.marked || !window.DOMPurify) return document.createTextNode(text);
  const div = document.createElement("div");
  div.innerHTML = DOMPurify.sanitize(marked.parse(text));
  return div;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function renderList() {
  const list = $("conversations");
  list.replaceChildren();
  for (const c of [...conversations].sort((a, b) => b.updated - a.updated)) {
    const li = el("li", c === current ? "current" : "");
    li.dataset.id = c.id;
    const open = el("button", "open", c.title || "New chat");
    open.type = "button";
    open.addEventListener("click", () => { current = c; persist(); render(); });
    const del = el("button", "delete", "×");
    del.type = "button";
    del.title = "Delete this conversation";
    del.addEventListener("click", () => {
      conversations = conversations.filter((x) => x !== c);
      if (current === c) current = null;
      persist();
      render();
    });
    li.append(open, del);
    list.append(li);
  }
}

function renderMessage(m) {
  const box = el("div", "message " + m.role);
  box.append(el("div", "role", m.role));
  if (m.reasoning) {
    const d = el("details", "thought");
    d.open = !m.content && !m.done;  // open while the model thinks, folded once it answers
    d.append(el("summary", "", m.done || m.content ? "Thought" : "Thinking…"), el("div", "text", m.reasoning));
    box.append(d);
  }
  const body = el("div", "body");
  if (m.role === "assistant") body.append(markdown(m.content || ""));
  else body.textContent = m.content;
  box.append(body);
  for (const call of m.tool_calls || []) {
    box.append(el("div", "tool-call", `call ${call.name}(${call.arguments})`));
  }
  if (m.error) box.append(el("div", "failed", m.error));
  const notes = [];
  if (m.stopped) notes.push("stopped");
  if (m.tps) notes.push(`${m.tps.toFixed(1)} tokens/s`);
  if (notes.length) box.append(el("div", "stats", notes.join(" · ")));
  return box;
}

function render() {
  renderList();
  const list = $("messages");
  list.replaceChildren(...(current ? current.messages.map(renderMessage) : []));
  list.scrollTop = list.scrollHeight;
  const busy = controller !== null;
  $("send").hidden = busy;
  $("stop").hidden = !busy;
}

function showError(text) {
  const e = $("error");
  e.textContent = text;
  e.hidden = !text;
}

async function refusal(res) {
  let detail = "";
  try {
    const body = await res.json();
    detail = (body.error && (body.error.message || body.error)) || body.message || JSON.stringify(body);
  } catch {
    detail = res.statusText;
  }
  return `The server refused the request: ${res.status} ${detail}`;
}

function wireMessages(conv) {
  const out = [];
  if (settings.system) out.push({ role: "system", content: settings.system });
  // The page does not run tools: a reply's calls are shown, and only its text is sent back.
  for (const m of conv.messages) {
    if (m.role === "assistant" && (m.error || !m.done)) continue;
    out.push({ role: m.role, content: m.content || "" });
  }
  return out;
}

function applyChunk(reply, chunk) {
  if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
  if (chunk.timings && chunk.timings.predicted_per_second) reply.tps = chunk.timings.predicted_per_second;
  const choice = (chunk.choices || [])[0];
  if (!choice) return;
  const d = choice.delta || {};
  if (d.reasoning_content) reply.reasoning = (reply.reasoning || "") + d.reasoning_content;
  if (d.content) reply.content += d.content;
  for (const t of d.tool_calls || []) {
    reply.tool_calls = reply.tool_calls || [];
    const call = (reply.tool_calls[t.index || 0] ||= { name: "", arguments: "" });
    if (t.function && t.function.name) call.name += t.function.name;
    if (t.function && t.function.arguments) call.arguments += t.function.arguments;
  }
  if (choice.finish_reason) reply.finish = choice.finish_reason;
}

async function send(text) {
  showError("");
  if (!current) {
    current = { id: crypto.randomUUID(), title: text.slice(0, 60), messages: [], updated: Date.now() };
    conversations.push(current);
  }
  const conv = current;
  conv.messages.push({ role: "user", content: text });
  const reply = { role: "assistant", content: "", reasoning: "", done: false };
  const body = { messages: wireMessages(conv), stream: true, temperature: Number(settings.temperature) };
  if (settings.maxTokens) body.max_tokens = Number(settings.maxTokens);
  if (thinkingSwitch) body.chat_template_kwargs = { enable_thinking: !!settings.thinking };
  conv.messages.push(reply);
  // The server keeps the reply's stream under the conversation's id, so a page reloaded
  // before it ends reads it again (see `resume`).
  await follow(conv, reply, (signal) => fetch(API + "/v1/chat/completions", {
    method: "POST", headers: { ...headers(), "X-Conversation-Id": conv.id }, body: JSON.stringify(body), signal,
  }));
}

// Replies a reload cut short: the server still has their streams (for five minutes after they
// end), so each is read again from its start and goes on where it is.
async function resume() {
  for (const conv of conversations) {
    const reply = conv.messages[conv.messages.length - 1];
    if (!reply || reply.role !== "assistant" || reply.done || reply.error) continue;
    Object.assign(reply, { content: "", reasoning: "", tool_calls: undefined, finish: undefined });
    await follow(conv, reply, (signal) => fetch(API + "/v1/stream?conv_id=" + encodeURIComponent(conv.id),
      { headers: headers(), signal }), "The reply was cut off when the page closed, and the server no longer has it.");
  }
}

// Reads `reply`'s stream from `open(signal)` into it as it comes; `gone` is what a 404 says instead.
async function follow(conv, reply, open, gone) {
  conv.updated = Date.now();
  controller = new AbortController();
  controller.convId = conv.id;
  persist();
  render();
  const started = performance.now();
  let drawn = 0;
  try {
    const res = await open(controller.signal);
    if (!res.ok) {
      reply.error = res.status === 404 && gone ? gone : await refusal(res);
      if (conv === current) showError(reply.error);
      return;
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffered.indexOf("\n\n")) >= 0) {
        const event = buffered.slice(0, end);
        buffered = buffered.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
          applyChunk(reply, JSON.parse(line.slice(6)));
          drawn += 1;
        }
      }
      render();
    }
    reply.done = true;
    if (!reply.tps && drawn > 1) reply.tps = drawn / ((performance.now() - started) / 1000);
  } catch (e) {
    if (e.name === "AbortError") {
      reply.stopped = true;
      reply.done = true;
    } else {
      reply.error = `The reply failed: ${e.message}`;
      if (conv === current) showError(reply.error);
    }
  } finally {
    controller = null;
    conv.updated = Date.now();
    persist();
    render();
  }
}

// The reply's generation outlives its reader (it is kept for a reload): a stop says so to the server.
function stopReply() {
  if (!controller) return;
  const convId = controller.convId;
  controller.abort();
  fetch(API + "/v1/stream?conv_id=" + encodeURIComponent(convId), { method: "DELETE", headers: headers() })
    .catch(() => {});
}

function bindSettings() {
  const fields = { system: "system", temperature: "temperature", maxTokens: "max-tokens", apiKey: "api-key" };
  for (const [key, id] of Object.entries(fields)) {
    $(id).value = settings[key];
    $(id).addEventListener("input", () => {
      settings[key] = $(id).value;
      localStorage.setItem(SETTINGS, JSON.stringify(settings));
    });
  }
  $("thinking").checked = !!settings.thinking;
  $("thinking").addEventListener("change", () => {
    settings.thinking = $("thinking").checked;
    localStorage.setItem(SETTINGS, JSON.stringify(settings));
  });
  $("settings-toggle").addEventListener("click", () => {
    const form = $("settings");
    form.hidden = !form.hidden;
    $("settings-toggle").setAttribute("aria-expanded", String(!form.hidden));
  });
}

async function describeServer() {
  try {
    const res = await fetch(API + "/props", { headers: headers() });
    if (!res.ok) return;
    const props = await res.json();
    $("model-name").textContent = props.model_alias || "ember";
    // The switch is shown only where the model's template reads it.
    thinkingSwitch = /enable_thinking/.test(props.chat_template || "");
    $("thinking-row").hidden = !thinkingSwitch;
  } catch {
    // The page works without it: the name and the switch are extras.
  }
}

function start() {
  bindSettings();
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("input").value.trim();
    if (!text || controller) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", stopReply);
  $("new-chat").addEventListener("click", () => { current = null; persist(); showError(""); render(); });
  render();
  describeServer();
  resume();
}

start();
