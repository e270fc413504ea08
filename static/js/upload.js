/* The upload page: a small tus 1.0 client of our own (create, PATCH in chunks, HEAD to resume, DELETE to cancel),
   then the version is created through the API and its inspection is followed until the signature is known.

   An upload's URL is kept in localStorage under the file's name, size and modification time: after a reload,
   choosing the same file again continues where it stopped. A dropped connection is retried with a growing pause
   and resumes from the offset the server has. */
(function () {
  "use strict";

  const form = document.getElementById("upload-form");
  if (!form) return;

  const TUS_VERSION = "1.0.0";
  const CHUNK_SIZE = parseInt(form.dataset.chunkSize, 10) || 5 * 1024 * 1024;
  const NEEDS_SIGNATURE = (form.dataset.needsSignature || "").split(",").filter(Boolean);
  // From the format registry (modelport/core/formats/): the format an extension suggests, each format's name.
  const FORMAT_HINTS = JSON.parse(document.getElementById("format-hints").textContent);
  const EXTENSION_FORMATS = FORMAT_HINTS.extensions;
  const RETRY_DELAYS = [1, 2, 4, 8, 15, 30]; // seconds; the last one repeats
  const MAX_RETRIES = 20;
  const POLL_MS = 1000;

  const $ = (id) => document.getElementById(id);
  const nameInput = $("id_name");
  const fileInput = $("id_file");
  const formatSelect = $("id_format");
  const batchInput = $("id_max_batch_size");
  const signatureText = $("id_signature");
  const exampleText = $("id_example_request");
  const EXAMPLE_MAX_BYTES = parseInt(form.dataset.exampleMaxBytes, 10) || 1024 * 1024;
  const dropZone = $("drop-zone");
  const fileNameOut = $("upload-file-name");
  const submitButton = $("upload-submit");
  const statusBox = $("upload-status");
  const progress = $("upload-progress");
  const progressText = $("upload-progress-text");
  const cancelButton = $("upload-cancel");
  const formError = $("upload-form-error");
  const editor = $("signature-editor");
  const rowsBox = $("signature-rows");
  const rowTemplate = $("signature-row-template");
  const result = $("upload-result");

  let chosenFile = null;
  let controller = null; // aborts the request in flight when the user cancels
  let finished = null; // {key, url}: a finished upload whose version was refused; a fix of the form reuses it

  // --- Helpers ---------------------------------------------------------------------------------------------------

  function csrfToken() {
    const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    if (match) return decodeURIComponent(match[1]);
    const field = form.querySelector("[name=csrfmiddlewaretoken]");
    return field ? field.value : "";
  }

  function storageKey(file) {
    return "modelport-upload:" + [file.name, file.size, file.lastModified].join(":");
  }

  function humanBytes(n) {
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
  }

  function humanSeconds(s) {
    if (!isFinite(s)) return "";
    s = Math.round(s);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }

  function b64(text) {
    return btoa(unescape(encodeURIComponent(text)));
  }

  function sleep(ms, signal) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(resolve, ms);
      if (signal) signal.addEventListener("abort", () => { clearTimeout(timer); reject(new DOMException("Aborted", "AbortError")); });
    });
  }

  class HttpError extends Error {
    constructor(status, body) {
      super((body && body.error && body.error.message) || "HTTP " + status);
      this.status = status;
      this.body = body;
    }
  }

  async function readError(response) {
    try { return await response.json(); } catch (e) { return null; }
  }

  // --- Field errors, beside their field (the same markup as Django's) ------------------------------------------

  const API_FIELDS = { name: "name", upload_id: "file", file: "file", format: "format", signature: "signature",
                       max_batch_size: "max_batch_size", example_request: "example_request",
                       decoupled: "decoupled" };

  function clearErrors() {
    form.querySelectorAll(".errorlist").forEach((el) => el.remove());
    form.querySelectorAll(".has-error").forEach((el) => el.classList.remove("has-error"));
    form.querySelectorAll("[aria-invalid]").forEach((el) => el.removeAttribute("aria-invalid"));
    formError.hidden = true;
    formError.textContent = "";
  }

  function fieldError(field, messages) {
    const box = $("field-" + field);
    let input = $("id_" + field);
    if (!box || !input) { formMessage(messages.join(" ")); return; }
    let before = field === "file" ? dropZone : input;
    if (field === "signature" && !rowsBox.hidden) {
      // The rows stand in for the (hidden) JSON box: the message goes above them, and to their first field.
      showEditor(true);
      before = rowsBox;
      input = rowsBox.querySelector(".sig-name") || input;
    }
    const folded = box.closest("details");
    if (folded) folded.open = true; // the example request's box, folded by default
    const list = document.createElement("ul");
    list.className = "errorlist";
    list.id = "id_" + field + "_error";
    messages.forEach((m) => { const li = document.createElement("li"); li.textContent = m; list.appendChild(li); });
    before.parentNode.insertBefore(list, before);
    box.classList.add("has-error");
    input.setAttribute("aria-invalid", "true");
    const described = (input.getAttribute("aria-describedby") || "").split(" ").filter((x) => x && x !== list.id);
    described.push(list.id);
    input.setAttribute("aria-describedby", described.join(" "));
  }

  function formMessage(text) {
    formError.hidden = false;
    const p = document.createElement("p");
    p.textContent = text;
    formError.appendChild(p);
  }

  function showApiErrors(error) {
    const body = error.body && error.body.error;
    const fields = (body && body.fields) || {};
    let shown = false;
    const grouped = {};
    Object.keys(fields).forEach((key) => {
      let field = API_FIELDS[key.split(/[.[]/)[0]];
      // "A TorchScript artifact carries no readable signature" comes keyed by the upload; it asks for the signature.
      if (field === "file" && fields[key].every((m) => /signature/i.test(m))) field = "signature";
      if (field) { (grouped[field] = grouped[field] || []).push(...fields[key]); shown = true; }
      else { formMessage(key === "non_field_errors" ? fields[key].join(" ") : key + ": " + fields[key].join(" ")); shown = true; }
    });
    Object.keys(grouped).forEach((field) => fieldError(field, grouped[field]));
    if (!shown && error.field) fieldError(error.field, [error.message]);
    else if (!shown) formMessage(error.message || "The upload failed.");
    if (/signature/i.test(error.message || "")) showEditor(true);
    (form.querySelector("[aria-invalid=true]") || formError).focus();
  }

  // --- The signature editor --------------------------------------------------------------------------------------

  function addRow(kind, tensor) {
    const row = rowTemplate.content.firstElementChild.cloneNode(true);
    const table = $("signature-" + kind).querySelector("tbody");
    const n = table.children.length + 1;
    row.querySelector(".sig-name").setAttribute("aria-label", (kind === "inputs" ? "Input " : "Output ") + n + " name");
    row.querySelector(".sig-datatype").setAttribute("aria-label", (kind === "inputs" ? "Input " : "Output ") + n + " datatype");
    row.querySelector(".sig-dims").setAttribute("aria-label", (kind === "inputs" ? "Input " : "Output ") + n + " dims");
    if (tensor) {
      row.querySelector(".sig-name").value = tensor.name || "";
      row.querySelector(".sig-datatype").value = String(tensor.datatype || "FP32").trim().toUpperCase().replace(/^TYPE_/, "");
      row.querySelector(".sig-dims").value = (tensor.dims || [-1]).join(", ");
    }
    row.querySelector(".sig-remove").addEventListener("click", () => { row.remove(); syncSignature(); });
    row.addEventListener("input", syncSignature);
    row.addEventListener("change", syncSignature);
    table.appendChild(row);
    return row;
  }

  function readRows(kind) {
    const tensors = [];
    $("signature-" + kind).querySelectorAll("tbody tr").forEach((row) => {
      const name = row.querySelector(".sig-name").value.trim();
      const dimsText = row.querySelector(".sig-dims").value.trim();
      if (!name && (!dimsText || dimsText === "-1")) return; // an untouched row
      const parts = dimsText ? dimsText.split(/[\s,×x]+/).filter(Boolean) : [];
      const dims = parts.map((p) => (/^-?\d+$/.test(p) ? parseInt(p, 10) : NaN));
      tensors.push({ name: name, datatype: row.querySelector(".sig-datatype").value, dims: dims, dimsText: dimsText });
    });
    return tensors;
  }

  // The rows become the JSON of the signature field (what the API and the no-script form take).
  function syncSignature() {
    const inputs = readRows("inputs");
    const outputs = readRows("outputs");
    if (!inputs.length && !outputs.length) { signatureText.value = ""; return null; }
    const bad = inputs.concat(outputs).find((t) => !t.name || t.dims.some((d) => isNaN(d)));
    const strip = (t) => ({ name: t.name, datatype: t.datatype, dims: t.dims });
    signatureText.value = JSON.stringify({ inputs: inputs.map(strip), outputs: outputs.map(strip) });
    if (!bad) return null;
    return bad.name ? "Dims of " + bad.name + " must be whole numbers or -1, e.g. -1, 3, 224, 224 (got “" + bad.dimsText + "”)."
                    : "Every tensor needs a name.";
  }

  function signatureWanted() {
    if (NEEDS_SIGNATURE.includes(formatSelect.value)) return true;
    if (!formatSelect.value && chosenFile) {
      const ext = chosenFile.name.split(".").pop().toLowerCase();
      if (NEEDS_SIGNATURE.includes(EXTENSION_FORMATS[ext])) return true;
      // An archive may be a Python model (which needs a signature) or a SavedModel (which carries one): offer it.
      if (/\.(zip|tar\.gz|tgz|tar)$/i.test(chosenFile.name)) return true;
    }
    return false;
  }

  function showEditor(force) {
    editor.hidden = !(force || signatureWanted() || signatureText.value.trim());
  }

  function initEditor() {
    let existing = null;
    try { existing = signatureText.value.trim() ? JSON.parse(signatureText.value) : null; } catch (e) { existing = null; }
    if (signatureText.value.trim() && !existing) return; // unparsable JSON typed without the script: keep the text box
    ((existing && existing.inputs) || [null]).forEach((t) => addRow("inputs", t));
    ((existing && existing.outputs) || [null]).forEach((t) => addRow("outputs", t));
    $("signature-add-input").addEventListener("click", () => addRow("inputs").querySelector(".sig-name").focus());
    $("signature-add-output").addEventListener("click", () => addRow("outputs").querySelector(".sig-name").focus());
    rowsBox.hidden = false;
    $("field-signature").hidden = true; // the rows write it
    showEditor(false);
  }

  // --- Choosing a file -------------------------------------------------------------------------------------------

  async function chooseFile(file) {
    chosenFile = file;
    finished = null;
    fileNameOut.textContent = file ? file.name + " (" + humanBytes(file.size) + ")" : "";
    showEditor(false);
    afterChoosing(file);
    if (!file) return;
    const url = localStorage.getItem(storageKey(file));
    if (!url) return;
    try {
      const response = await fetch(url, { method: "HEAD", headers: { "Tus-Resumable": TUS_VERSION }, credentials: "same-origin" });
      if (response.ok) {
        const offset = parseInt(response.headers.get("Upload-Offset"), 10) || 0;
        fileNameOut.textContent += " · an earlier upload reached " + humanBytes(offset) + "; it continues from there.";
      } else {
        localStorage.removeItem(storageKey(file));
      }
    } catch (e) { /* offline: the upload will try again */ }
  }

  fileInput.addEventListener("change", () => chooseFile(fileInput.files[0] || null));
  ["dragenter", "dragover"].forEach((type) => dropZone.addEventListener(type, (event) => {
    event.preventDefault();
    dropZone.classList.add("dragover");
  }));
  ["dragleave", "drop"].forEach((type) => dropZone.addEventListener(type, () => dropZone.classList.remove("dragover")));
  dropZone.addEventListener("drop", (event) => {
    event.preventDefault();
    const files = event.dataTransfer && event.dataTransfer.files;
    if (!files || !files.length) return;
    try { fileInput.files = files; } catch (e) { /* old browsers: keep our own reference */ }
    chooseFile(files[0]);
  });
  formatSelect.addEventListener("change", () => showEditor(false));

  // --- tus -------------------------------------------------------------------------------------------------------

  function tusHeaders(extra) {
    return Object.assign({ "Tus-Resumable": TUS_VERSION, "X-CSRFToken": csrfToken() }, extra || {});
  }

  async function createUpload(file, signal) {
    const metadata = "filename " + b64(file.name) + ",filetype " + b64(file.type || "application/octet-stream");
    const response = await fetch("/api/v1/uploads/", {
      method: "POST", credentials: "same-origin", signal: signal,
      headers: tusHeaders({ "Upload-Length": String(file.size), "Upload-Metadata": metadata }),
    });
    if (response.status !== 201) throw new HttpError(response.status, await readError(response));
    const url = new URL(response.headers.get("Location"), window.location.href).href;
    localStorage.setItem(storageKey(file), url);
    return url;
  }

  async function currentOffset(url, signal) {
    const response = await fetch(url, { method: "HEAD", credentials: "same-origin", signal: signal,
                                        headers: { "Tus-Resumable": TUS_VERSION }, cache: "no-store" });
    if (response.status === 404 || response.status === 410) return null; // gone: start again
    if (!response.ok) throw new HttpError(response.status, null);
    return parseInt(response.headers.get("Upload-Offset"), 10) || 0;
  }

  function retryable(error) {
    if (error.name === "AbortError") return false;
    if (error instanceof TypeError) return true; // fetch's network failure
    return error instanceof HttpError && (error.status >= 500 || error.status === 423 || error.status === 429 || error.status === 409);
  }

  // Upload `file` (resuming a stored upload when there is one); resolves to the upload's URL.
  async function upload(file, signal, onProgress) {
    const key = storageKey(file);
    let url = localStorage.getItem(key);
    let offset = null;
    let attempt = 0;
    for (;;) {
      try {
        if (url && offset === null) {
          offset = await currentOffset(url, signal);
          if (offset === null) { localStorage.removeItem(key); url = null; }
        }
        if (!url) { url = await createUpload(file, signal); offset = 0; }
        onProgress(offset);
        while (offset < file.size) {
          const chunk = file.slice(offset, Math.min(offset + CHUNK_SIZE, file.size));
          const response = await fetch(url, {
            method: "PATCH", credentials: "same-origin", signal: signal, body: chunk,
            headers: tusHeaders({ "Upload-Offset": String(offset), "Content-Type": "application/offset+octet-stream" }),
          });
          if (response.status !== 204) {
            const body = await readError(response);
            if (response.status === 404 || response.status === 410) { localStorage.removeItem(key); url = null; }
            throw new HttpError(response.status, body);
          }
          offset = parseInt(response.headers.get("Upload-Offset"), 10);
          attempt = 0;
          onProgress(offset);
        }
        if (file.size === 0) throw new HttpError(400, { error: { message: "The file is empty." } });
        return url;
      } catch (error) {
        const gone = error instanceof HttpError && (error.status === 404 || error.status === 410);
        if (!retryable(error) && !(gone && attempt === 0)) throw error; // a vanished upload is started again, once
        if (++attempt > MAX_RETRIES) throw error;
        offset = null; // ask the server where it stands before going on
        const delay = RETRY_DELAYS[Math.min(attempt - 1, RETRY_DELAYS.length - 1)];
        setProgressText("Connection lost; trying again in " + delay + " s…");
        // Back online sooner? Go on at once.
        const backOnline = new Promise((resolve) => window.addEventListener("online", resolve, { once: true }));
        await Promise.race([sleep(delay * 1000, signal), backOnline]);
      }
    }
  }

  // --- Progress --------------------------------------------------------------------------------------------------

  let samples = [];

  function setProgressText(text) { progressText.textContent = text; }

  function progressReporter(file) {
    samples = [];
    return (offset) => {
      const now = performance.now();
      samples.push({ t: now, bytes: offset });
      while (samples.length > 2 && now - samples[0].t > 10000) samples.shift(); // speed over the last ~10 s
      const first = samples[0];
      const speed = now > first.t ? ((offset - first.bytes) * 1000) / (now - first.t) : 0;
      const percent = file.size ? (offset * 100) / file.size : 100;
      progress.value = percent;
      progress.setAttribute("aria-valuetext", percent.toFixed(0) + "%");
      let text = humanBytes(offset) + " of " + humanBytes(file.size) + " (" + percent.toFixed(0) + "%)";
      if (speed > 0 && offset < file.size) {
        text += " · " + humanBytes(speed) + "/s · " + humanSeconds((file.size - offset) / speed) + " left";
      }
      setProgressText(text);
    };
  }

  cancelButton.addEventListener("click", async () => {
    if (controller) controller.abort();
    const file = chosenFile;
    if (!file) return;
    const url = localStorage.getItem(storageKey(file));
    localStorage.removeItem(storageKey(file));
    finished = null;
    if (url) {
      try { await fetch(url, { method: "DELETE", credentials: "same-origin", headers: tusHeaders() }); } catch (e) { /* expires */ }
    }
    statusBox.hidden = true;
    submitButton.disabled = false;
    formMessage("Upload cancelled.");
  });

  // --- The API: model, version, inspection ---------------------------------------------------------------------

  async function api(method, path, body) {
    const response = await fetch(path, {
      method: method, credentials: "same-origin",
      headers: { "Content-Type": "application/json", "Accept": "application/json", "X-CSRFToken": csrfToken() },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const data = response.status === 204 ? null : await readError(response);
    if (!response.ok) throw new HttpError(response.status, data);
    return data;
  }

  function signatureTable(signature) {
    const table = document.createElement("table");
    table.className = "table compact signature";
    table.innerHTML = "<thead><tr><th scope='col'>Tensor</th><th scope='col'>Name</th><th scope='col'>Datatype</th><th scope='col'>Shape</th></tr></thead><tbody></tbody>";
    const body = table.querySelector("tbody");
    [["input", signature.inputs || []], ["output", signature.outputs || []]].forEach(([kind, tensors]) => {
      tensors.forEach((t) => {
        const row = document.createElement("tr");
        [kind, t.name, t.datatype, (t.dims || []).join(" × ")].forEach((value, i) => {
          const cell = document.createElement("td");
          if (i === 1) { const code = document.createElement("code"); code.textContent = value; cell.appendChild(code); }
          else cell.textContent = value;
          row.appendChild(cell);
        });
        body.appendChild(row);
      });
    });
    return table;
  }

  async function followInspection(name, version) {
    const modelUrl = "/models/" + encodeURIComponent(name) + "/";
    result.hidden = false;
    $("upload-view-model").href = modelUrl;
    $("upload-result-title").textContent = "Version " + version.number + " of " + name + ": inspecting…";
    $("upload-result-status").textContent = "Checking the file and reading its signature.";
    let current = version;
    while (current.status === "validating" || current.status === "uploading") {
      await sleep(POLL_MS);
      try {
        current = await api("GET", "/api/v1/models/" + encodeURIComponent(name) + "/versions/" + version.number + "/");
      } catch (error) {
        if (error.status === 404) throw error;
      }
    }
    $("upload-result-title").textContent = "Version " + current.number + " of " + name + " is " + current.status;
    if (current.status === "ready") {
      $("upload-result-status").textContent = "Format " + current.format + ", " + humanBytes(current.size) +
        (current.max_batch_size ? ", max batch size " + current.max_batch_size : ", no batching") + ". Signature:";
      $("upload-signature").replaceChildren(signatureTable(current.signature || {}));
      const said = [];
      if (current.has_example_request) said.push("Uploaded with its example request" + (current.format === "python" ? ", which the trial call sent instead of zeros." : ", checked against the signature."));
      (current.notes || []).forEach((note) => said.push(note));
      said.forEach((text) => { const p = document.createElement("p"); p.className = "muted small upload-note"; p.textContent = text; $("upload-signature").appendChild(p); });
      const deploy = $("upload-deploy");
      deploy.href = "/deployments/new/?model=" + encodeURIComponent(name) + "&version=" + current.number;
      deploy.hidden = false;
      deploy.focus();
    } else {
      $("upload-result-status").textContent = "";
      const error = $("upload-error");
      error.textContent = current.error || "The file could not be used.";
      error.hidden = false;
      // The example request is checked at inspection when the file carries the signature (ONNX): said beside it.
      const prefix = "example_request: ";
      if ((current.error || "").startsWith(prefix)) fieldError("example_request", [current.error.slice(prefix.length)]);
    }
  }

  // --- What the local runtime serves: said when the chosen file is of a format it cannot run --------------------

  const NOT_LOCAL = (form.dataset.notLocal || "").split(",").filter(Boolean);
  const FORMAT_NAMES = FORMAT_HINTS.names;

  function warnFormat() {
    const warning = $("format-warning");
    let fmt = formatSelect.value;
    if (!fmt && chosenFile) fmt = EXTENSION_FORMATS[chosenFile.name.split(".").pop().toLowerCase()] || "";
    const refused = fmt && NOT_LOCAL.includes(fmt);
    warning.hidden = !refused;
    warning.textContent = refused ? (FORMAT_NAMES[fmt] || fmt) + " cannot be served by this portal's local runtime: " +
                                    form.dataset.notLocalReason + ". It can still be uploaded." : "";
  }
  formatSelect.addEventListener("change", warnFormat);

  // --- A pipeline definition instead of a model file ---------------------------------------------------------------

  const pipelineBox = $("pipeline-mode");
  const definitionText = $("pipeline-definition");
  const preview = $("pipeline-preview");
  const submitLabel = submitButton.textContent;
  let pipelineMode = false;
  let previewTimer = null;
  // Once a pipeline is saved its button stays disabled until the name or the definition changes: a second press
  // made a second, identical version.
  let pipelineSaved = false;

  function pipelineChanged() {
    if (!pipelineSaved) return;
    pipelineSaved = false;
    submitButton.disabled = false;
    if (pipelineMode) submitButton.textContent = "Create the pipeline";
  }

  function setPipelineMode(on) {
    pipelineMode = on;
    pipelineBox.hidden = !on;
    pipelineChanged();
    // The drop zone is the file upload's: a pipeline has no file (leaving pipeline mode brings it back).
    ["field-format", "field-max_batch_size", "signature-editor", "same-bytes", "format-warning", "drop-zone", "example-request"].forEach((id) => {
      const box = $(id);
      if (box && on) box.hidden = true;
    });
    if (!on) { $("field-format").hidden = false; $("field-max_batch_size").hidden = false; $("example-request").hidden = false; dropZone.hidden = false; showEditor(false); warnFormat(); }
    submitButton.textContent = on ? "Create the pipeline" : submitLabel;
    if (!on) preview.replaceChildren();
  }

  async function checkPipeline(save) {
    clearErrors();
    const body = new URLSearchParams({ name: nameInput.value, definition: definitionText.value });
    if (save) body.set("save", "1");
    submitButton.disabled = true;
    try {
      const response = await fetch(form.dataset.pipelineUrl, {
        method: "POST", credentials: "same-origin", body: body,
        headers: { "X-CSRFToken": csrfToken(), "Accept": "text/html" },
      });
      preview.innerHTML = await response.text(); // the portal's own escaped template (web/_pipeline_preview.html)
      const answer = $("pipeline-preview-body");
      if (response.status === 201 && answer) {
        pipelineSaved = true;
        submitButton.textContent = "Pipeline created";
        result.hidden = false;
        $("upload-result-title").textContent = "Pipeline " + nameInput.value + " version " + answer.dataset.createdVersion + " is ready";
        $("upload-result-status").textContent = "Its steps are deployed with it, each with its own serving settings.";
        $("upload-view-model").href = answer.dataset.modelUrl;
        const deploy = $("upload-deploy");
        deploy.href = answer.dataset.deployUrl;
        deploy.textContent = "Deploy this pipeline";
        deploy.hidden = false;
        deploy.focus();
      }
    } catch (e) {
      formMessage("The definition could not be checked: " + e.message);
    } finally {
      submitButton.disabled = pipelineSaved;
    }
  }

  function schedulePreview() {
    clearTimeout(previewTimer);
    previewTimer = setTimeout(() => { if (pipelineMode && definitionText.value.trim()) checkPipeline(false); }, 600);
  }

  definitionText.addEventListener("input", () => { pipelineChanged(); schedulePreview(); });
  nameInput.addEventListener("input", () => { if (pipelineMode) { pipelineChanged(); schedulePreview(); } });
  $("pipeline-check").addEventListener("click", () => checkPipeline(false));
  $("pipeline-leave").addEventListener("click", () => { setPipelineMode(false); fileInput.focus(); });
  $("pipeline-paste").addEventListener("click", () => { setPipelineMode(true); definitionText.focus(); });

  const MAX_DEFINITION = 256 * 1024;

  // A chosen .json file: a pipeline definition switches the page to pipeline mode; a signature file is pointed to
  // the signature editor; anything else goes up as a file like any other (and the portal says what it is).
  async function readJsonChoice(file) {
    if (!file || !/\.json$/i.test(file.name) || file.size > MAX_DEFINITION) return false;
    let value;
    const text = await file.text();
    try { value = JSON.parse(text); } catch (e) { return false; }
    if (value && typeof value === "object" && !Array.isArray(value) && "steps" in value) {
      definitionText.value = text;
      if (!nameInput.value) nameInput.value = file.name.replace(/\.json$/i, "").toLowerCase().replace(/[^a-z0-9-]+/g, "-").replace(/^-+|-+$/g, "");
      setPipelineMode(true);
      checkPipeline(false);
      return true;
    }
    if (value && typeof value === "object" && ("inputs" in value || "outputs" in value)) {
      fieldError("file", ["This is a signature, not a model: choose the model file, and import this one under Signature."]);
      return true;
    }
    return false;
  }

  // --- The signature editor: importing a .signature.json ---------------------------------------------------------

  function fillRows(signature) {
    ["inputs", "outputs"].forEach((kind) => {
      $("signature-" + kind).querySelector("tbody").replaceChildren();
      const tensors = Array.isArray(signature[kind]) && signature[kind].length ? signature[kind] : [null];
      tensors.forEach((t) => addRow(kind, t));
    });
    syncSignature();
    showEditor(true);
  }

  function datatypeChoices() {
    return Array.from(rowTemplate.content.querySelectorAll(".sig-datatype option")).map((o) => o.value).filter(Boolean);
  }

  function importProblems(signature) {
    const choices = datatypeChoices();
    const problems = [];
    ["inputs", "outputs"].forEach((kind) => {
      (Array.isArray(signature[kind]) ? signature[kind] : []).forEach((t, i) => {
        const where = kind + "[" + i + "]" + (t && typeof t.name === "string" && t.name ? " (" + t.name + ")" : "");
        if (!t || typeof t !== "object") { problems.push(where + " is not an object with name, datatype and dims"); return; }
        if (typeof t.name !== "string" || !t.name.trim()) problems.push(where + " has no name");
        const datatype = typeof t.datatype === "string" ? t.datatype.trim().toUpperCase().replace(/^TYPE_/, "") : "";
        if (!choices.includes(datatype)) {
          problems.push(where + ": datatype " + JSON.stringify(t.datatype === undefined ? null : t.datatype) +
                        " is not one of " + choices.join(", ") + " (or Triton's TYPE_* names)");
        }
        if (!Array.isArray(t.dims) || !t.dims.length || !t.dims.every((d) => Number.isInteger(d) && (d > 0 || d === -1))) {
          problems.push(where + ": dims " + (t.dims === undefined ? "are missing: give" : JSON.stringify(t.dims) + " are not") +
                        " a list of whole numbers or -1, e.g. [-1, 3, 224, 224]");
        }
      });
    });
    return problems;
  }

  $("signature-import").addEventListener("change", async (event) => {
    const file = event.target.files[0];
    if (!file) return;
    clearErrors();
    let value = null;
    try { value = JSON.parse(await file.text()); } catch (e) { /* said below */ }
    if (!value || typeof value !== "object" || (!Array.isArray(value.inputs) && !Array.isArray(value.outputs))) {
      fieldError("signature", [file.name + " is not a signature file: it needs {\"inputs\": [...], \"outputs\": [...]}."]);
      return;
    }
    // Every value is checked before any row is filled: a datatype the select lacks became "" without a word (and
    // "unknown datatype ''" at upload), and missing dims became -1.
    const problems = importProblems(value);
    if (problems.length) {
      fieldError("signature", problems.map((p) => file.name + ": " + p));
      return;
    }
    fillRows(value);
    compareWithPrevious();
  });

  // --- The example request: a .json file read into its box ------------------------------------------------------

  $("example-request-import").addEventListener("change", async (event) => {
    const file = event.target.files[0];
    if (!file) return;
    clearErrors();
    if (file.size > EXAMPLE_MAX_BYTES) {
      // The API's words for the same text (modelport/core/example_request.py).
      fieldError("example_request", ["The example request is " + file.size.toLocaleString("en-US") + " bytes; at most " + EXAMPLE_MAX_BYTES.toLocaleString("en-US") + "."]);
      return;
    }
    exampleText.value = await file.text();
  });

  // --- The model's earlier versions: a changed signature, or the same bytes again, is said before uploading ------

  let earlier = null; // {name, versions: [...]} of the model named in the form, or null for a new model
  let acknowledged = ""; // the notice the user has seen and chosen to upload past
  let chosenSha = null;

  async function loadEarlier() {
    const name = nameInput.value;
    if (!name) { earlier = null; return; }
    if (earlier && earlier.name === name) return;
    // Only a name the team has (the page's list of them) is looked up: a new name has no versions, and asking
    // the API for it logged a 404 in the console at every keystroke.
    const known = Array.from(document.querySelectorAll("#model-names option")).some((option) => option.value === name);
    if (!known) { earlier = { name: name, versions: [] }; return; }
    try {
      const response = await fetch("/api/v1/models/" + encodeURIComponent(name) + "/versions/", {
        credentials: "same-origin", headers: { Accept: "application/json" } });
      earlier = { name: name, versions: response.ok ? await response.json() : [] };
    } catch (e) {
      earlier = null;
    }
  }

  function describe(t) { return t.datatype + " " + (t.dims || []).join(" × "); }

  function signatureChanges(before, after) {
    const changes = [];
    ["inputs", "outputs"].forEach((kind) => {
      const word = kind === "inputs" ? "input" : "output";
      const old = new Map((before[kind] || []).map((t) => [t.name, t]));
      const now = new Map((after[kind] || []).map((t) => [t.name, t]));
      now.forEach((t, name) => {
        if (!old.has(name)) changes.push(word + " " + name + " added (" + describe(t) + ")");
        else if (describe(old.get(name)) !== describe(t)) changes.push(word + " " + name + ": " + describe(old.get(name)) + " → " + describe(t));
      });
      old.forEach((t, name) => { if (!now.has(name)) changes.push(word + " " + name + " removed"); });
    });
    return changes;
  }

  async function sha256Hex(file) {
    // SubtleCrypto exists on https and localhost pages only; elsewhere the check is skipped, not faked.
    if (!file || !window.crypto || !crypto.subtle || file.size > 256 * 1024 * 1024) return null;
    const digest = await crypto.subtle.digest("SHA-256", await file.arrayBuffer());
    return Array.from(new Uint8Array(digest)).map((b) => b.toString(16).padStart(2, "0")).join("");
  }

  async function compareWithPrevious() {
    await loadEarlier();
    const diffBox = $("signature-diff");
    const sameBox = $("same-bytes");
    diffBox.hidden = true;
    sameBox.hidden = true;
    if (pipelineMode || !earlier || !earlier.versions.length) return;
    const versions = earlier.versions.slice().sort((a, b) => b.number - a.number);
    const latest = versions[0];
    if (chosenFile && chosenSha) {
      const same = versions.find((v) => v.sha256 === chosenSha);
      if (same) {
        sameBox.hidden = false;
        sameBox.textContent = "Version " + same.number + " of " + earlier.name + " has exactly these bytes already (" +
          same.status + "). Uploading them again makes version " + (latest.number + 1) + " with the same content; " +
          "to serve them, deploy version " + same.number + ".";
      }
    }
    const typed = signatureText.value.trim();
    if (!editor.hidden && typed && latest.signature && ((latest.signature.inputs || []).length || (latest.signature.outputs || []).length)) {
      let now = null;
      try { now = JSON.parse(typed); } catch (e) { now = null; }
      const changes = now ? signatureChanges(latest.signature, now) : [];
      if (changes.length) {
        diffBox.hidden = false;
        diffBox.textContent = "This signature differs from version " + latest.number + "'s: " + changes.join("; ") +
          ". The new version gets it; deployments and pipelines that name version " + latest.number + " keep theirs.";
      }
    }
  }

  async function afterChoosing(file) {
    chosenSha = null;
    acknowledged = "";
    if (!pipelineMode) submitButton.textContent = submitLabel;
    if (pipelineMode) setPipelineMode(false);
    warnFormat();
    if (await readJsonChoice(file)) return;
    chosenSha = await sha256Hex(file).catch(() => null);
    compareWithPrevious();
  }

  let compareTimer = null;
  nameInput.addEventListener("input", () => {
    acknowledged = "";
    if (!pipelineMode) submitButton.textContent = submitLabel;
    clearTimeout(compareTimer);
    compareTimer = setTimeout(compareWithPrevious, 400);
  });
  editor.addEventListener("input", () => { acknowledged = ""; clearTimeout(compareTimer); compareTimer = setTimeout(compareWithPrevious, 400); });
  editor.addEventListener("change", () => { clearTimeout(compareTimer); compareTimer = setTimeout(compareWithPrevious, 400); });

  // Runs before the upload's own submit handler: pipeline mode takes the submit over, and a notice about the
  // signature or the bytes must have been seen once before the upload goes ahead.
  form.addEventListener("submit", async (event) => {
    if (pipelineMode) {
      event.preventDefault();
      event.stopImmediatePropagation();
      await checkPipeline(true);
      return;
    }
    const notices = ["signature-diff", "same-bytes"].map((id) => $(id)).filter((box) => !box.hidden);
    const seen = notices.map((box) => box.textContent).join("|");
    if (notices.length && acknowledged !== seen) {
      event.preventDefault();
      event.stopImmediatePropagation();
      acknowledged = seen;
      submitButton.textContent = "Upload anyway";
      notices[0].setAttribute("tabindex", "-1");
      notices[0].focus();
    }
  });

  // --- Submit ------------------------------------------------------------------------------------------------------

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors();
    const name = nameInput.value;
    const file = chosenFile || fileInput.files[0];
    let invalid = false;
    if (!name) { fieldError("name", ["Enter the model's name."]); invalid = true; }
    else if (form.dataset.namePattern && !new RegExp("^(?:" + form.dataset.namePattern + ")$").test(name)) {
      // Checked here, before a long upload: the API creates the model only with its first version.
      fieldError("name", ["“" + name + "” is not a valid name: " + form.dataset.nameRule + "."]); invalid = true;
    }
    if (!file) { fieldError("file", ["Choose a model file."]); invalid = true; }
    const signatureProblem = editor.hidden ? null : syncSignature();
    if (signatureProblem) { fieldError("signature", [signatureProblem]); invalid = true; }
    let signature;
    if (!editor.hidden && signatureText.value.trim()) {
      try { signature = JSON.parse(signatureText.value); } catch (e) {
        fieldError("signature", ["Not valid JSON: " + e.message]); invalid = true;
      }
    }
    if (invalid) { (form.querySelector("[aria-invalid=true]") || nameInput).focus(); return; }

    submitButton.disabled = true;
    result.hidden = true;
    $("upload-deploy").hidden = true;
    $("upload-error").hidden = true;
    controller = new AbortController();
    try {
      const key = storageKey(file);
      let uploadUrl;
      if (finished && finished.key === key) {
        uploadUrl = finished.url;
      } else {
        statusBox.hidden = false;
        $("upload-status-file").textContent = file.name;
        progress.value = 0;
        try {
          uploadUrl = await upload(file, controller.signal, progressReporter(file));
        } catch (error) {
          error.field = "file"; // what the tus endpoint refuses (too large, expired) concerns the file
          throw error;
        }
        finished = { key: key, url: uploadUrl };
      }
      statusBox.hidden = true;
      // create_model: a new model is created together with its first version, so that a refused file leaves no
      // empty model behind.
      const body = { upload_id: uploadUrl.replace(/\/+$/, "").split("/").pop(), create_model: true };
      if (formatSelect.value) body.format = formatSelect.value;
      if (batchInput.value !== "") body.max_batch_size = Number(batchInput.value);
      if (signature) body.signature = signature;
      if ($("id_decoupled").checked) body.decoupled = true;
      const example = exampleText.value.trim();
      if (example) {
        // As parsed JSON; text that is not JSON goes as it is, for the API to say what is wrong with it (the
        // checks and their words are the API's: modelport/core/example_request.py).
        try { body.example_request = JSON.parse(example); } catch (e) { body.example_request = example; }
      }
      let version;
      try {
        version = await api("POST", "/api/v1/models/" + encodeURIComponent(name) + "/versions/", body);
      } catch (error) {
        if (error.status === 409 || (error.status === 400 && /upload/i.test(JSON.stringify(error.body && error.body.error.fields)))) {
          finished = null; // the upload is used or gone: the next try sends the file again
          localStorage.removeItem(key);
        }
        throw error;
      }
      localStorage.removeItem(key);
      finished = null;
      await followInspection(name, version);
    } catch (error) {
      statusBox.hidden = true;
      if (error.name === "AbortError") return;
      if (error instanceof HttpError) showApiErrors(error);
      else formMessage("The upload failed: " + error.message);
    } finally {
      submitButton.disabled = false;
      controller = null;
    }
  });

  initEditor();
})();
