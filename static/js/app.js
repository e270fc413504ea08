/* Modelport's small page behaviours: copy buttons, the deploy form's switches and slider, the "Try it" panel, the
   traffic charts (inline SVG, no chart library) and the log tail. Every page works without it; it only adds. */
(function () {
  "use strict";

  const $ = (id) => document.getElementById(id);

  function csrfToken() {
    // The gateway accepts the session only with X-CSRFToken equal to the csrftoken cookie.
    const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    if (match) return decodeURIComponent(match[1]);
    const field = document.querySelector("[name=csrfmiddlewaretoken]");
    return field ? field.value : "";
  }
  // Shared with the page's other scripts (try_stream.js), which load after this one.
  window.modelport = Object.assign(window.modelport || {}, { csrfToken });

  // --- Copy buttons: <button data-copy="id-of-element"> ----------------------------------------------------------

  function selectText(target) {
    const range = document.createRange();
    range.selectNodeContents(target);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  function initCopyButtons() {
    document.querySelectorAll("button[data-copy]").forEach((button) => {
      const label = button.textContent;
      let timer = null;
      const say = (text, ms) => {
        button.textContent = text;
        clearTimeout(timer);
        timer = setTimeout(() => { button.textContent = label; }, ms);
      };
      button.addEventListener("click", async () => {
        const target = $(button.dataset.copy);
        if (!target) return;
        // "Copied" only when the clipboard took it: navigator.clipboard exists only on https and localhost pages,
        // and may still refuse. Otherwise the text is selected for the user's own copy.
        try {
          if (!navigator.clipboard || !window.isSecureContext) throw new Error("no clipboard here");
          await navigator.clipboard.writeText(target.textContent);
          say("Copied", 1500);
        } catch (e) {
          selectText(target);
          say(/Mac|iPhone|iPad/.test(navigator.platform) ? "Press ⌘C" : "Press Ctrl+C", 4000);
        }
      });
    });
  }

  // --- Download req.json: the request Try it holds for that model, or the model's example -----------------------

  function initDownloads() {
    const examplesNode = $("try-it-examples");
    if (!examplesNode) return;
    const examples = JSON.parse(examplesNode.textContent);
    document.querySelectorAll("button.download-request").forEach((button) => {
      button.addEventListener("click", () => {
        const select = $("try-it-model");
        const model = button.dataset.model || (select && select.value);
        const input = $("try-it-input");
        const text = (select && select.value === model && input) ? input.value
                   : (examples[model] ? examples[model].request : input.value);
        const link = document.createElement("a");
        link.href = URL.createObjectURL(new Blob([text.trim() + "\n"], { type: "application/json" }));
        link.download = "req.json";
        document.body.appendChild(link);
        link.click();
        setTimeout(() => { URL.revokeObjectURL(link.href); link.remove(); }, 1000);
      });
    });
  }

  // --- Buttons that post once: a second click while the first one works would only wait again -----------------

  function initBusyButtons() {
    document.querySelectorAll("button[data-busy-label]").forEach((button) => {
      const form = button.closest("form");
      if (!form) return;
      form.addEventListener("submit", () => {
        setTimeout(() => { button.disabled = true; button.textContent = button.dataset.busyLabel; }, 0);
      });
    });
  }

  // --- Tables wider than the screen say that they scroll ---------------------------------------------------------

  function markOverflowingTables() {
    document.querySelectorAll(".table-wrap").forEach((wrap) => {
      if (wrap.scrollWidth > wrap.clientWidth + 1) wrap.dataset.overflowing = "true";
      else delete wrap.dataset.overflowing;
    });
  }

  // --- Deploy form ---------------------------------------------------------------------------------------------------

  function initDeployForm() {
    // Replicas and GPUs only for the Kubernetes runtime; for the local one, a note saying why they are gone.
    document.querySelectorAll("[data-runtime-select]").forEach((box) => {
      const select = $(box.dataset.runtimeSelect);
      if (!select || select.disabled) return;
      const update = () => { box.hidden = select.value !== box.dataset.runtime; };
      select.addEventListener("change", update);
      update();
    });
    // GPU instances only where the runtime has GPUs: the local runtime has none (the API refuses 'gpu' there).
    document.querySelectorAll("select[data-gpu-option]").forEach((kind) => {
      const runtime = kind.form && kind.form.elements.namedItem("runtime");
      const gpu = kind.querySelector('option[value="gpu"]');
      if (!runtime || !gpu) return;
      const update = () => {
        const without = runtime.value !== kind.dataset.gpuOption;
        gpu.disabled = without;
        gpu.textContent = without ? "GPU (the Kubernetes runtime only)" : "GPU";
        if (without && kind.value === "gpu" && !kind.disabled) kind.value = "cpu";
      };
      runtime.addEventListener("change", update);
      update();
    });
    // A pool and its idle time only for a shared deployment.
    document.querySelectorAll("[data-placement-radio]").forEach((box) => {
      const radios = document.querySelectorAll('input[type="radio"][name="' + box.dataset.placementRadio + '"]');
      const update = () => {
        const checked = Array.from(radios).find((radio) => radio.checked);
        box.hidden = !checked || checked.value !== box.dataset.placement;
      };
      radios.forEach((radio) => radio.addEventListener("change", update));
      update();
    });
    // Extreme values: a warning beside the field while typing, before anything is deployed.
    document.querySelectorAll("input[data-warn-above]").forEach((input) => {
      const note = document.createElement("p");
      note.className = "field-warning";
      note.id = input.id + "_warning";
      note.setAttribute("role", "status");
      note.hidden = true;
      input.closest(".field").appendChild(note);
      const update = () => {
        const value = Number(input.value);
        const limit = Number(input.dataset.warnAbove);
        const over = input.value !== "" && !isNaN(value) && value > limit;
        note.hidden = !over;
        note.textContent = over ? "Check this value: " + value.toLocaleString() + ". " + input.dataset.warning : "";
        const described = (input.getAttribute("aria-describedby") || "").split(" ").filter((x) => x && x !== note.id);
        if (over) described.push(note.id);
        input.setAttribute("aria-describedby", described.join(" "));
      };
      input.addEventListener("input", update);
      update();
    });
    // Batching settings: only while dynamic batching is on.
    document.querySelectorAll("[data-batching-switch]").forEach((box) => {
      const toggle = $(box.dataset.batchingSwitch);
      if (!toggle) return;
      const update = () => { box.hidden = !toggle.checked; };
      toggle.addEventListener("change", update);
      update();
    });
    // The queue delay slider (0-100,000 µs) and its number box (any value up to the API's limit) move together.
    document.querySelectorAll("input[type=range][data-slider-for]").forEach((slider) => {
      const number = $(slider.dataset.sliderFor);
      if (!number) return;
      slider.addEventListener("input", () => { number.value = slider.value; number.dispatchEvent(new Event("input")); });
      number.addEventListener("input", () => {
        const value = parseInt(number.value, 10);
        if (!isNaN(value)) slider.value = String(Math.min(Math.max(value, 0), Number(slider.max)));
      });
    });
  }

  // --- Try it --------------------------------------------------------------------------------------------------------

  function concatBytes(parts) {
    const total = parts.reduce((n, p) => n + p.byteLength, 0);
    const out = new Uint8Array(total);
    let offset = 0;
    parts.forEach((p) => { out.set(new Uint8Array(p), offset); offset += p.byteLength; });
    return out;
  }

  // A request whose BYTES inputs carry files: Triton's binary tensor extension. The JSON header names each such
  // input with parameters.binary_data_size; its bytes follow the header in input order, each BYTES element as a
  // 4-byte little-endian length and the raw bytes.
  async function binaryBody(request, files) {
    const encoder = new TextEncoder();
    const chunks = [];
    for (const input of request.inputs || []) {
      const file = files[input.name];
      if (!file) continue;
      const data = await file.arrayBuffer();
      const length = new ArrayBuffer(4);
      new DataView(length).setUint32(0, data.byteLength, true);
      delete input.data;
      input.datatype = "BYTES";
      input.shape = (input.shape && input.shape.length ? input.shape : [1]).map(() => 1);
      input.parameters = Object.assign({}, input.parameters, { binary_data_size: data.byteLength + 4 });
      chunks.push(length, data);
    }
    const header = encoder.encode(JSON.stringify(request));
    return { body: concatBytes([header.buffer].concat(chunks)), headerLength: header.byteLength };
  }

  // Indented JSON with arrays of plain values on one line: outputs stay readable.
  function compactJson(value) {
    return JSON.stringify(value, null, 2).replace(/\[\s+([^[\]{}]*?)\s+\]/g,
      (match, inner) => "[" + inner.split(/,\n\s*/).join(", ") + "]"); // literal newlines only separate items
  }

  async function readInferResponse(response) {
    const headerLength = parseInt(response.headers.get("Inference-Header-Content-Length"), 10);
    const buffer = await response.arrayBuffer();
    const bytes = new Uint8Array(buffer);
    const jsonPart = isNaN(headerLength) ? bytes : bytes.subarray(0, headerLength);
    const text = new TextDecoder().decode(jsonPart);
    let pretty = text;
    try { pretty = compactJson(JSON.parse(text)); } catch (e) { /* not JSON: show as it came */ }
    if (!isNaN(headerLength) && bytes.byteLength > headerLength) {
      pretty += "\n\n(+ " + (bytes.byteLength - headerLength) + " bytes of binary output data)";
    }
    return pretty;
  }

  function initTryIt() {
    const send = $("try-it-send");
    if (!send) return;
    const examplesNode = $("try-it-examples");
    const examples = examplesNode ? JSON.parse(examplesNode.textContent) : {};
    const modelSelect = $("try-it-model");
    const input = $("try-it-input");
    const output = $("try-it-output");
    const latency = $("try-it-latency");

    function showModel() {
      const example = examples[modelSelect.value];
      if (example) {
        input.value = example.request;
        input.dataset.inferPath = example.path;
      }
      document.querySelectorAll(".try-it-file, .try-it-note").forEach((box) => { box.hidden = box.dataset.model !== modelSelect.value; });
    }
    modelSelect.addEventListener("change", showModel);

    // A text box for a BYTES input that takes text: what is typed becomes each of its elements in the request below
    // (JSON carries a BYTES element as a UTF-8 string), one line per input as the page writes it.
    document.querySelectorAll("input.try-it-text").forEach((box) => {
      box.addEventListener("input", () => {
        let request;
        try { request = JSON.parse(input.value); } catch (e) { return; } // hand-edited into invalid JSON: left alone
        const tensor = (request.inputs || []).find((t) => t.name === box.dataset.input);
        if (!tensor) return;
        const count = (tensor.shape || [1]).reduce((a, b) => a * Math.max(b, 0), 1);
        tensor.data = Array(count).fill(box.value);
        input.value = '{"inputs": [\n' + request.inputs.map((t) => "  " + JSON.stringify(t)).join(",\n") + "\n]}";
      });
    });

    // "Use a sample digit": the sample PNG goes into the file input, as if the user had chosen it.
    document.querySelectorAll("button.sample-image").forEach((button) => {
      button.addEventListener("click", async () => {
        const fileInput = $(button.dataset.fileInput);
        try {
          const response = await fetch(button.dataset.url, { credentials: "same-origin" });
          if (!response.ok) throw new Error("HTTP " + response.status);
          const transfer = new DataTransfer();
          transfer.items.add(new File([await response.blob()], "digit-7.png", { type: "image/png" }));
          fileInput.files = transfer.files;
          button.textContent = "Sample digit chosen";
        } catch (e) {
          button.textContent = "The sample could not be loaded: " + e.message;
        }
      });
    });

    // The panel opens once the deployment serves; the live status (refreshed every 2 s) says when.
    const section = $("try-it");
    const waiting = $("try-it-waiting");
    document.body.addEventListener("htmx:afterSettle", () => {
      const live = $("deployment-live");
      if (!live || !section || !waiting) return;
      const serving = live.dataset.serving === "yes";
      section.hidden = !serving;
      waiting.hidden = serving;
      const reasons = {
        failed: "it failed to start (see the status above), so Retry or Edit settings first.",
        stopping: "it is stopped, so Start it first.",
        stopped: "it is stopped, so Start it first.",
      };
      if (!serving) {
        waiting.textContent = "Try it works once the deployment serves: " +
          (reasons[live.dataset.status] || "this panel opens by itself when the status turns ready.");
      }
    });
    document.querySelectorAll(".try-it-file").forEach((box) => { box.hidden = box.dataset.model !== modelSelect.value; });

    send.addEventListener("click", async () => {
      output.classList.remove("error");
      let request;
      try {
        request = JSON.parse(input.value);
      } catch (e) {
        output.classList.add("error");
        output.textContent = "The request is not valid JSON: " + e.message;
        latency.textContent = "";
        return;
      }
      const files = {};
      document.querySelectorAll(".try-it-file:not([hidden]) input[type=file]").forEach((fileInput) => {
        if (fileInput.files[0]) files[fileInput.dataset.input] = fileInput.files[0];
      });
      const headers = { "X-CSRFToken": csrfToken(), "Accept": "application/json" };
      let body;
      if (Object.keys(files).length) {
        const binary = await binaryBody(request, files);
        body = binary.body;
        headers["Content-Type"] = "application/octet-stream";
        headers["Inference-Header-Content-Length"] = String(binary.headerLength);
      } else {
        body = JSON.stringify(request);
        headers["Content-Type"] = "application/json";
      }
      send.disabled = true;
      latency.textContent = "Sending…";
      const started = performance.now();
      try {
        const response = await fetch(input.dataset.inferPath, { method: "POST", credentials: "same-origin", headers: headers, body: body });
        const text = await readInferResponse(response);
        const ms = performance.now() - started;
        latency.textContent = "HTTP " + response.status + " in " + ms.toFixed(1) + " ms";
        output.textContent = text;
        if (!response.ok) output.classList.add("error");
      } catch (e) {
        latency.textContent = "";
        output.classList.add("error");
        output.textContent = "The request failed: " + e.message;
      } finally {
        send.disabled = false;
      }
    });
  }

  // --- Traffic charts ------------------------------------------------------------------------------------------------

  const SVG = "http://www.w3.org/2000/svg";
  const CHART_W = 600;
  const CHART_H = 170;
  const PAD = { left: 44, right: 10, top: 10, bottom: 22 };

  function el(name, attrs, text) {
    const node = document.createElementNS(SVG, name);
    Object.keys(attrs || {}).forEach((k) => node.setAttribute(k, attrs[k]));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function formatNumber(v) {
    if (v >= 100) return Math.round(v).toLocaleString();
    if (v >= 10) return v.toFixed(1);
    if (v >= 1 || v === 0) return v.toFixed(v === 0 ? 0 : 2);
    return String(Number(v.toPrecision(2))); // 0.013, not 0.01
  }

  function clock(t) {
    const d = new Date(t);
    return String(d.getHours()).padStart(2, "0") + ":" + String(d.getMinutes()).padStart(2, "0");
  }

  // series: [{name, cls, points: [{t (ms), v}]}] drawn over the time range [t0, t1]
  function drawChart(container, series, label, t0, t1) {
    const all = series.flatMap((s) => s.points);
    const body = container.querySelector(".chart-body");
    if (!all.length) { body.replaceChildren(); return; }
    const vmax = Math.max(...all.map((p) => p.v), 0) || 1;
    const x = (t) => PAD.left + (t1 > t0 ? ((t - t0) / (t1 - t0)) : 0.5) * (CHART_W - PAD.left - PAD.right);
    const y = (v) => CHART_H - PAD.bottom - (v / vmax) * (CHART_H - PAD.top - PAD.bottom);
    const svg = el("svg", { viewBox: "0 0 " + CHART_W + " " + CHART_H, role: "img", "aria-label": label });
    svg.appendChild(el("line", { class: "axis", x1: PAD.left, y1: y(0), x2: CHART_W - PAD.right, y2: y(0) }));
    svg.appendChild(el("line", { class: "axis", x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: y(0) }));
    svg.appendChild(el("text", { class: "label", x: PAD.left - 4, y: PAD.top + 8, "text-anchor": "end" }, formatNumber(vmax)));
    svg.appendChild(el("text", { class: "label", x: PAD.left - 4, y: y(0), "text-anchor": "end" }, "0"));
    svg.appendChild(el("text", { class: "label", x: PAD.left, y: CHART_H - 6 }, clock(t0)));
    svg.appendChild(el("text", { class: "label", x: CHART_W - PAD.right, y: CHART_H - 6, "text-anchor": "end" }, clock(t1)));
    series.forEach((s) => {
      const points = s.points.filter((p) => p.v !== null && p.v !== undefined && !isNaN(p.v));
      if (!points.length) return;
      const path = points.map((p) => x(p.t).toFixed(1) + "," + y(p.v).toFixed(1)).join(" ");
      const line = el("polyline", { class: "series-" + s.cls, points: path });
      line.appendChild(el("title", {}, s.name));
      svg.appendChild(line);
      if (s.dots) {
        // Sparse measurements: a dot for each, so that a lone one shows too.
        points.forEach((p) => svg.appendChild(el("circle", { class: "dot-" + s.cls, cx: x(p.t).toFixed(1), cy: y(p.v).toFixed(1), r: 2.5 })));
      }
    });
    body.replaceChildren(svg);
  }

  function summaryRate(data, series) {
    if (typeof data.requests_per_second === "number") return data.requests_per_second;
    if (Array.isArray(data.requests_per_second) && data.requests_per_second.length) {
      const values = data.requests_per_second.map(Number).filter((v) => !isNaN(v));
      return values.reduce((a, b) => a + b, 0) / (values.length || 1);
    }
    return series.length ? series.reduce((a, p) => a + p.rps, 0) / series.length : 0;
  }

  function initCharts() {
    const box = $("traffic");
    if (!box) return;
    const summary = $("metrics-summary");
    const url = box.dataset.metricsUrl;

    const codesLine = $("metrics-codes");
    const minutes = () => Math.round((Number(new URL(url, window.location.href).searchParams.get("minutes")) || 15));

    function noTraffic() {
      summary.textContent = "No requests in the last " + minutes() + " minutes: send one with Try it, or with one of " +
                            "the snippets above.";
      summary.dataset.empty = "true";
      if (codesLine) codesLine.hidden = true;
      box.querySelectorAll(".chart-body").forEach((b) => b.replaceChildren());
      box.querySelector(".charts").hidden = true;
    }

    async function refresh() {
      let data;
      try {
        const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (!response.ok) { noTraffic(); return; } // 404: no metrics (yet) for this deployment
        data = await response.json();
      } catch (e) {
        return; // offline for a moment: keep what is shown
      }
      const bucket = data.bucket_seconds || 10;
      const series = (data.series || []).map((p) => ({
        t: Date.parse(p.time),
        rps: typeof p.requests_per_second === "number" ? p.requests_per_second : (p.requests || 0) / bucket,
        eps: (p.errors || 0) / bucket,
        p50: p.p50_ms, p99: p.p99_ms,
      })).filter((p) => !isNaN(p.t)).sort((a, b) => a.t - b.t);
      const total = series.reduce((n, p) => n + p.rps, 0);
      if (!series.length || total === 0) { noTraffic(); return; }
      delete summary.dataset.empty;
      box.querySelector(".charts").hidden = false;
      const window_ = data.window_seconds ? Math.round(data.window_seconds / 60) : minutes();
      const parts = [(data.requests || 0).toLocaleString() + " request" + (data.requests === 1 ? "" : "s") +
                     " (" + formatNumber(summaryRate(data, series)) + "/s)"];
      if (typeof data.error_rate === "number") {
        parts.push((data.error_rate * 100).toFixed(data.error_rate && data.error_rate < 0.1 ? 1 : 0) + "% errors");
      }
      if (data.p50_ms !== null && data.p50_ms !== undefined) parts.push("p50 " + formatNumber(data.p50_ms) + " ms");
      if (data.p99_ms !== null && data.p99_ms !== undefined) parts.push("p99 " + formatNumber(data.p99_ms) + " ms");
      summary.textContent = parts.join(" · ") + " in the last " + window_ + " minutes";
      if (codesLine) {
        const codes = Object.entries(data.codes || {});
        codesLine.hidden = !codes.length;
        codesLine.replaceChildren(document.createTextNode("Status codes: "));
        codes.forEach(([code, n], i) => {
          const item = document.createElement("span");
          item.className = "code code-" + code[0] + "xx";
          item.textContent = "HTTP " + code + " × " + n.toLocaleString();
          codesLine.appendChild(item);
          if (i < codes.length - 1) codesLine.appendChild(document.createTextNode(", "));
        });
      }
      // The whole window on the time axis; buckets without requests count as zero requests (and no latency).
      const step = bucket * 1000;
      const t1 = Math.max(Date.now(), series[series.length - 1].t);
      const t0 = data.window_seconds ? t1 - data.window_seconds * 1000 : series[0].t;
      const byBucket = new Map(series.map((p) => [Math.floor(p.t / step), p]));
      const rates = [];
      const errors = [];
      for (let t = Math.floor(t0 / step) * step; t <= t1; t += step) {
        const point = byBucket.get(Math.floor(t / step));
        rates.push({ t: t, v: point ? point.rps : 0 });
        errors.push({ t: t, v: point ? point.eps : 0 });
      }
      drawChart($("chart-requests"), [{ name: "requests/s", cls: "requests", points: rates },
                                      { name: "errors/s (5xx, 429)", cls: "errors", points: errors }],
                "Requests per second; peak " + formatNumber(Math.max(...series.map((p) => p.rps))), t0, t1);
      drawChart($("chart-latency"), [
        { name: "p50 ms", cls: "p50", dots: true, points: series.map((p) => ({ t: p.t, v: p.p50 })) },
        { name: "p99 ms", cls: "p99", dots: true, points: series.map((p) => ({ t: p.t, v: p.p99 })) },
      ], "Latency in milliseconds, p50 and p99", t0, t1);
    }

    refresh();
    setInterval(() => { if (!document.hidden) refresh(); }, 10000);
  }

  // --- The log tail: stay at the bottom unless the reader scrolled up ----------------------------------------------

  function initLogTail() {
    const container = $("log-container");
    if (!container) return;
    let stick = true;
    container.addEventListener("scroll", (event) => {
      const log = event.target;
      if (log.id === "triton-log") stick = log.scrollTop + log.clientHeight >= log.scrollHeight - 8;
    }, true);
    document.body.addEventListener("htmx:afterSwap", (event) => {
      if (event.detail.target !== container) return;
      const log = $("triton-log");
      if (log && stick) log.scrollTop = log.scrollHeight;
    });
    // Folded, the log has no height to scroll: opened, it starts at its latest lines.
    const box = $("log-box");
    if (box) box.addEventListener("toggle", () => {
      const log = $("triton-log");
      if (box.open && log && stick) log.scrollTop = log.scrollHeight;
    });
  }

  // --- Live refreshes keep what the user chose --------------------------------------------------------------------

  // The live status re-sends the page's panels out of band every 2 s. One that comes back unchanged is left in
  // place: replacing it unticked the Tune panel's "narrow" checkbox and emptied its canary percent moments after
  // they were filled (Apply then stopped at the checkbox, or rolled out to everyone), and took the focus away.
  // Every render masks the CSRF token afresh, so that field is left out of the comparison.
  function markupOf(element) {
    const copy = element.cloneNode(true);
    copy.removeAttribute("hx-swap-oob");
    copy.querySelectorAll("[name=csrfmiddlewaretoken]").forEach((field) => field.remove());
    return copy.outerHTML;
  }

  function initQuietRefresh() {
    document.body.addEventListener("htmx:oobBeforeSwap", (event) => {
      // An outerHTML swap hands over a fragment holding the new element; other styles, the element itself.
      const fragment = event.detail.fragment;
      const incoming = fragment instanceof DocumentFragment && fragment.children.length === 1 ? fragment.children[0]
                                                                                              : fragment;
      if (incoming instanceof Element && markupOf(incoming) === markupOf(event.detail.target)) {
        event.detail.shouldSwap = false;
      }
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    initCopyButtons();
    initDownloads();
    initBusyButtons();
    markOverflowingTables();
    window.addEventListener("resize", markOverflowingTables);
    document.body.addEventListener("htmx:afterSettle", markOverflowingTables);
    initDeployForm();
    initTryIt();
    initCharts();
    initLogTail();
    initQuietRefresh();
    document.body.dataset.js = "ready"; // for browser tests: the behaviours above are in place
  });
})();
