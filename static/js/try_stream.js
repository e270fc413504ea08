/* The streaming Try it of a decoupled model (templates/web/_try_stream.html): Generate POSTs the prompt to
   /generate_stream with the session cookie and X-CSRFToken, and reads the answer's Server-Sent Events with fetch and
   a ReadableStream reader, each `data:` piece appended as it arrives; Stop aborts the fetch, and the gateway then
   closes its connection to Triton, which cancels the stream. Plain JS, no library. */
(function () {
  "use strict";

  const $ = (id) => document.getElementById(id);

  // app.js's (base.html loads it first, both deferred): the gateway takes the session only with X-CSRFToken.
  const csrfToken = () => window.modelport.csrfToken();

  // The text of one piece: the output's value (text_output for the OpenAI contract), whatever else Triton adds.
  // An event's pieces: its text_output, a list when the model sent several pieces in one response (its sending fell
  // behind); otherwise the first output there is, as text.
  function eventPieces(data) {
    const output = data.text_output;
    if (typeof output === "string") return [output];
    if (Array.isArray(output) && output.every((p) => typeof p === "string")) return output;
    const key = Object.keys(data).find((k) => k !== "model_name" && k !== "model_version" && k !== "id");
    if (key === undefined) return [""];
    const value = data[key];
    return [typeof value === "string" ? value : JSON.stringify(value)];
  }

  // One event's lines ("event: ...", "data: ..."): its name and its data joined, as the SSE format says.
  function parseEvent(block) {
    let name = "message";
    const data = [];
    block.split("\n").forEach((line) => {
      if (line.startsWith("event:")) name = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    });
    return { name: name, data: data.join("\n") };
  }

  function init() {
    const generate = $("try-stream-generate");
    if (!generate) return;
    const stop = $("try-stream-stop");
    const output = $("try-stream-output");
    const status = $("try-stream-status");
    const select = $("try-stream-model");
    const boxes = Array.from(document.querySelectorAll(".try-stream-model"));
    let controller = null;

    const current = () => boxes.find((b) => !b.hidden) || boxes[0];
    if (select) {
      select.addEventListener("change", () => { boxes.forEach((b) => { b.hidden = b.dataset.model !== select.value; }); });
    }

    // The panel opens once the deployment serves, as the other Try it does (the live status says when).
    document.body.addEventListener("htmx:afterSettle", () => {
      const live = $("deployment-live");
      const section = $("try-stream");
      const waiting = $("try-stream-waiting");
      if (!live || !section || !waiting) return;
      const serving = live.dataset.serving === "yes";
      section.hidden = !serving;
      waiting.hidden = serving;
    });

    function fail(message) {
      output.classList.add("error");
      status.textContent = "";
      const line = document.createElement("span");
      line.className = "try-stream-error";
      line.textContent = (output.textContent ? "\n" : "") + message;
      output.appendChild(line);
    }

    function append(text) {
      output.appendChild(document.createTextNode(text));
      output.dataset.pieces = String(Number(output.dataset.pieces) + 1);
    }

    generate.addEventListener("click", async () => {
      const box = current();
      const body = {};
      body[box.dataset.input] = box.querySelector(".try-stream-prompt").value;
      const maxTokens = box.querySelector(".try-stream-max-tokens");
      if (maxTokens && maxTokens.value !== "") body.max_tokens = Number(maxTokens.value);
      output.textContent = "";
      output.dataset.pieces = "0";
      output.dataset.state = "streaming";
      output.classList.remove("error");
      status.textContent = "Generating…";
      generate.disabled = true;
      stop.disabled = false;
      controller = new AbortController();
      const started = performance.now();
      let first = null;
      try {
        const response = await fetch(box.dataset.path, {
          method: "POST", credentials: "same-origin", signal: controller.signal, body: JSON.stringify(body),
          headers: { "Content-Type": "application/json", "Accept": "text/event-stream", "X-CSRFToken": csrfToken() },
        });
        if (!response.ok) {
          const text = await response.text();
          let message = text;
          try { message = JSON.parse(text).error || text; } catch (e) { /* not JSON: shown as it is */ }
          fail("HTTP " + response.status + ": " + message);
          output.dataset.state = "failed";
          return;
        }
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        let held = "";
        let failed = false;
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          held += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
          let end;
          while ((end = held.indexOf("\n\n")) !== -1) {
            const event = parseEvent(held.slice(0, end));
            held = held.slice(end + 2);
            if (!event.data) continue;
            let data;
            try { data = JSON.parse(event.data); } catch (e) { data = { error: event.data }; }
            if (event.name === "error" || data.error !== undefined) {
              fail(String(data.error));
              failed = true;
              continue;
            }
            if (first === null) first = performance.now() - started;
            eventPieces(data).forEach(append);
            status.textContent = output.dataset.pieces + " pieces, the first after " + first.toFixed(0) + " ms";
          }
        }
        output.dataset.state = failed ? "failed" : "done";
        if (!failed) {
          status.textContent = output.dataset.pieces + " pieces in " + (performance.now() - started).toFixed(0) +
            " ms" + (first === null ? "" : ", the first after " + first.toFixed(0) + " ms");
        }
      } catch (e) {
        if (e.name === "AbortError") {
          output.dataset.state = "stopped";
          status.textContent = "Stopped after " + output.dataset.pieces + " pieces.";
        } else {
          output.dataset.state = "failed";
          fail("The request failed: " + e.message);
        }
      } finally {
        controller = null;
        generate.disabled = false;
        stop.disabled = true;
      }
    });

    stop.addEventListener("click", () => { if (controller) controller.abort(); });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
