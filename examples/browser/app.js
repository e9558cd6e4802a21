// The page: a client token from its own backend, then a chat completion streamed through credgate.
"use strict";

const form = document.getElementById("chat");
const promptInput = document.getElementById("prompt");
const statusLine = document.getElementById("status");
const errorLine = document.getElementById("error");
const output = document.getElementById("output");

let minting = null; // the promise of the latest GET /client-token: {token, expires_at, subject, gateway}

// A message for people from any error body: credgate's and the providers' are `{"error": {"message"}}`.
async function messageOf(response) {
  const text = await response.text();
  try {
    const message = JSON.parse(text).error.message;
    if (message) return message;
  } catch (_) {
    // not JSON: the status alone, below
  }
  return `${response.status} ${response.statusText}`.trim();
}

async function fetchClientToken() {
  let response;
  try {
    response = await fetch("/client-token", { cache: "no-store" });
  } catch (error) {
    throw new Error(`The backend could not be reached (${error.message}).`);
  }
  if (!response.ok) {
    throw new Error(`No client token: ${await messageOf(response)}`);
  }
  const session = await response.json();
  const until = new Date(session.expires_at).toLocaleTimeString();
  statusLine.textContent = `Ready: a client token for ${session.subject}, valid until ${until}.`;
  return session;
}

// The client token: the one asked for at load, or a new one (`renew`) once credgate refuses it.
function clientToken(renew = false) {
  if (renew || minting === null) {
    minting = fetchClientToken().catch((error) => {
      minting = null; // the next Send asks again
      statusLine.textContent = "";
      throw error;
    });
  }
  return minting;
}

function chat(session, text) {
  // The gateway's address comes with the token: nothing about credgate is written into this page.
  return fetch(session.gateway + "/proxy/openai/chat/completions", {
    method: "POST",
    headers: { Authorization: "Bearer " + session.token, "Content-Type": "application/json" },
    body: JSON.stringify({ model: "gpt-4o-mini", stream: true, messages: [{ role: "user", content: text }] }),
  });
}

// Server-sent events: `data: {json}` lines, events apart by a blank line, `data: [DONE]` at the end.
async function streamInto(response, element) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) !== -1) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "the provider sent an error");
        element.textContent += chunk.choices?.[0]?.delta?.content ?? "";
      }
    }
  }
}

async function send(text) {
  let response;
  try {
    response = await chat(await clientToken(), text);
    if (response.status === 401) {
      // Expired, or its project token rotated away: a new client token, then once more.
      statusLine.textContent = "The client token was refused; getting a new one…";
      response = await chat(await clientToken(true), text);
    }
  } catch (error) {
    if (!(error instanceof TypeError)) throw error;
    throw new Error(`credgate could not be reached, or refused this page's origin (${error.message}).`);
  }
  if (!response.ok) {
    // credgate marks its own errors; any other is the provider's, relayed unchanged.
    const who = response.headers.get("X-Credgate-Error") ? "credgate" : "The provider";
    throw new Error(`${who} answered ${response.status}: ${await messageOf(response)}`);
  }
  await streamInto(response, output);
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const button = form.querySelector("button");
  button.disabled = true;
  errorLine.textContent = "";
  output.textContent = "";
  try {
    await send(promptInput.value);
  } catch (error) {
    errorLine.textContent = error.message;
  } finally {
    button.disabled = false;
  }
});

clientToken().catch((error) => {
  errorLine.textContent = error.message;
});
