// The LLM chat test page (templates/serving/chat.html, docs/chat.md): the browser talks to the
// gateway itself, streamed (SSE), and keeps the conversation in the page only. For a pool or a
// private service it asks the server for a token of its own (one target, under an hour) and
// revokes it when the page closes or another target is chosen.
"use strict";

(() => {
  const root = document.getElementById("chat");
  if (!root) return;
  const $ = (id) => document.getElementById(id);
  const target = $("chat-target");
  const log = $("chat-log");
  const input = $("chat-input");
  const send = $("chat-send");
  const stop = $("chat-stop");
  const baseUrl = $("chat-base-url");
  const model = $("chat-model");
  const tokenField = $("chat-token");
  const connection = $("chat-connection");
  const csrf = () => document.querySelector('meta[name="csrf-token"]')?.content ?? "";

  let messages = []; // {role, content}: this page's conversation, never sent to Nexus's server
  let issued = null; // {id, token, expiresAt, revokeUrl, target}: the page's own token
  let running = null; // the AbortController of the reply being streamed

  function revoke(token, { closing = false } = {}) {
    if (!token) return;
    const body = new FormData();
    body.append("csrfmiddlewaretoken", csrf());
    // sendBeacon outlives the page; fetch with keepalive is its fallback.
    if (closing && navigator.sendBeacon(token.revokeUrl, body)) return;
    fetch(token.revokeUrl, { method: "POST", body, keepalive: true, credentials: "same-origin" });
  }

  function forget() {
    if (issued) revoke(issued);
    issued = null;
  }

  async function issue(value) {
    const body = new FormData();
    body.append("target", value);
    body.append("csrfmiddlewaretoken", csrf());
    const response = await fetch(root.dataset.tokenUrl, { method: "POST", body, credentials: "same-origin" });
    const answer = await response.json();
    if (!response.ok) throw new Error(answer.error || `the token was refused (${response.status})`);
    issued = {
      id: answer.id,
      token: answer.token,
      expiresAt: Date.parse(answer.expires_at),
      revokeUrl: answer.revoke_url,
      target: value,
    };
    tokenField.value = issued.token;
  }

  function say(text, level = "") {
    connection.textContent = text;
    connection.dataset.level = level;
  }

  // Fill the settings for the chosen pool or service; issue a token when it needs one.
  async function choose() {
    const option = target.selectedOptions[0];
    forget();
    if (!option || !option.value) {
      say("Fill in the settings below.", "info");
      $("chat-settings").open = true;
      return;
    }
    baseUrl.value = new URL(option.dataset.basePath, window.location.origin).href;
    model.value = option.dataset.model;
    tokenField.value = "";
    if (option.dataset.needsToken !== "true") {
      say("Public: no token needed.", "ok");
      return;
    }
    say("Getting a token…", "info");
    try {
      await issue(option.value);
      say("Connected with a token for this page (expires within the hour).", "ok");
    } catch (error) {
      say(`No token: ${error.message}. Paste one in the settings.`, "bad");
      $("chat-settings").open = true;
    }
  }

  function bubble(role, text = "") {
    $("chat-empty")?.remove();
    const item = document.createElement("li");
    item.className = `chat-message chat-${role}`;
    const who = document.createElement("span");
    who.className = "chat-role";
    who.textContent = role === "user" ? "You" : "Model";
    const body = document.createElement("div");
    body.className = "chat-text";
    body.textContent = text;
    item.append(who, body);
    log.append(item);
    log.scrollTop = log.scrollHeight;
    return body;
  }

  function busy(on) {
    send.disabled = on;
    stop.disabled = !on;
    input.disabled = on;
  }

  // Yield each `data:` payload of a server-sent event stream as it arrives.
  async function* events(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
        const data = event
          .split(/\r?\n/)
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).trimStart())
          .join("\n");
        if (data) yield data;
      }
    }
  }

  function stats({ ttftMs, tokens, seconds, answeredBy }) {
    const { format } = window.Nexus;
    $("chat-ttft").textContent = ttftMs == null ? "—" : format.duration(ttftMs / 1000);
    $("chat-tokens").textContent = tokens ? `${format.number(tokens)} token${tokens === 1 ? "" : "s"}` : "—";
    $("chat-speed").textContent = tokens > 1 && seconds > 0 ? format.rate(tokens / seconds, "tok") : "—";
    $("chat-answered-by").textContent = answeredBy || "—";
  }

  async function ask(text) {
    const option = target.selectedOptions[0];
    // A token past its expiry is gone: the conversation goes on with a fresh one.
    if (issued && Date.now() >= issued.expiresAt - 5000) {
      forget();
      await issue(option.value);
    }
    messages.push({ role: "user", content: text });
    bubble("user", text);
    const reply = bubble("assistant");
    reply.parentElement.setAttribute("aria-busy", "true");
    // A service scaled to zero holds this message in its queue while a replica starts.
    let waking = null;
    if (option?.dataset.asleep === "true") {
      waking = document.createElement("p");
      waking.className = "chat-note";
      waking.textContent = "The service is asleep: this message wakes it, and the reply waits while a replica starts.";
      reply.parentElement.append(waking);
    }
    running = new AbortController();
    busy(true);
    const started = performance.now();
    let first = null;
    let tokens = 0;
    let usageTokens = null;
    let answeredBy = "";
    try {
      const headers = { "Content-Type": "application/json" };
      if (tokenField.value) headers.Authorization = `Bearer ${tokenField.value}`;
      const response = await fetch(`${baseUrl.value.replace(/\/+$/, "")}/chat/completions`, {
        method: "POST",
        headers,
        body: JSON.stringify({
          model: model.value,
          messages,
          stream: true,
          stream_options: { include_usage: true },
        }),
        signal: running.signal,
        credentials: "omit",
      });
      answeredBy = response.headers.get("x-nexus-target") || "";
      if (!response.ok) {
        const problem = await response.json().catch(() => ({}));
        throw new Error(problem.error?.message || `the endpoint answered ${response.status}`);
      }
      for await (const data of events(response)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "the stream ended with an error");
        if (chunk.usage?.completion_tokens) usageTokens = chunk.usage.completion_tokens;
        const delta = chunk.choices?.[0]?.delta?.content;
        if (!delta) continue;
        if (first === null) {
          first = performance.now();
          waking?.remove();
        }
        tokens += 1;
        reply.textContent += delta;
        log.scrollTop = log.scrollHeight;
      }
      messages.push({ role: "assistant", content: reply.textContent });
    } catch (error) {
      const stopped = error.name === "AbortError";
      const note = document.createElement("p");
      note.className = stopped ? "chat-note" : "chat-note error";
      note.textContent = stopped ? "Stopped." : `Error: ${error.message}`;
      reply.parentElement.append(note);
      // What was written before the stop is part of the conversation; a failed turn is not.
      if (stopped && reply.textContent) messages.push({ role: "assistant", content: reply.textContent });
      else messages.pop();
    } finally {
      const ended = performance.now();
      reply.parentElement.removeAttribute("aria-busy");
      running = null;
      busy(false);
      input.focus();
      const count = usageTokens ?? tokens;
      stats({
        ttftMs: first === null ? null : first - started,
        tokens: count,
        seconds: first === null ? 0 : (ended - first) / 1000,
        answeredBy,
      });
    }
  }

  $("chat-compose").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text || running) return;
    input.value = "";
    ask(text);
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("chat-compose").requestSubmit();
    }
  });
  stop.addEventListener("click", () => running?.abort());
  $("chat-clear").addEventListener("click", () => {
    running?.abort();
    messages = [];
    log.replaceChildren();
    stats({ ttftMs: null, tokens: 0, seconds: 0, answeredBy: "" });
  });
  target.addEventListener("change", () => {
    messages = [];
    log.replaceChildren();
    choose();
  });
  // The page closes (or goes to the back/forward cache): its token goes with it.
  window.addEventListener("pagehide", () => {
    if (issued) revoke(issued, { closing: true });
    issued = null;
  });
  window.addEventListener("pageshow", (event) => {
    if (event.persisted) choose();
  });
  choose();
})();
