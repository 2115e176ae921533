// The session page: a small client of the public /v1 API (docs/ui.md). No framework, no build:
// every label from the server is put into the page as text, never as HTML.
"use strict";

const CONFIG = JSON.parse(document.getElementById("ui-config").textContent);
const KEY_STORAGE = "edgecut.apiKey"; // sessionStorage only: gone when the tab closes

const STOP_REASONS = {
  determined: "the class is settled: every hypothesis still possible is in the same class",
  decided: "a decision is settled: it is acceptable whichever hypothesis is true",
  confidence_reached: "the most probable answer reached the confidence asked for",
  max_tests: "the maximum number of tests has been run",
  budget_exhausted: "the cost budget is spent: every remaining test costs more than is left",
  tests_exhausted: "every test has been run",
  no_informative_test: "no remaining test can change the answer",
  indistinguishable: "the hypotheses left give the same outcome on every remaining test, so no test can tell their classes apart",
};

const $ = (id) => document.getElementById(id);
const page = { instance: null, options: {}, session: null, etag: null, tree: null, treeSvg: null };

// --- HTTP -----------------------------------------------------------------------------------

class Problem extends Error {
  constructor(status, body, requestId) {
    super((body && body.detail) || `HTTP ${status}`);
    this.status = status;
    this.title = (body && body.title) || `HTTP ${status}`;
    this.errors = (body && body.errors) || [];
    this.requestId = requestId || (body && body.request_id) || null;
  }
}

async function api(method, path, { body, headers = {}, raw = false } = {}) {
  const sent = { Accept: "application/json", ...headers };
  const key = sessionStorage.getItem(KEY_STORAGE);
  if (key) sent.Authorization = `Bearer ${key}`;
  if (body !== undefined) sent["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method, headers: sent, body: body === undefined ? undefined : (typeof body === "string" ? body : JSON.stringify(body)),
  });
  if (!response.ok) {
    let problem = null;
    try { problem = await response.json(); } catch (_) { /* not problem+json */ }
    throw new Problem(response.status, problem, response.headers.get("X-Request-ID"));
  }
  if (raw) return response;
  return { data: response.status === 204 ? null : await response.json(), etag: response.headers.get("ETag") };
}

function showError(error) {
  const box = $("error");
  $("error-title").textContent = error instanceof Problem ? `${error.status} ${error.title}:` : "Error:";
  $("error-detail").textContent = error.message;
  const list = $("error-list");
  list.replaceChildren(...(error.errors || []).map((e) => el("li", {}, `${e.path}: ${e.message}`)));
  $("error-request").textContent = error.requestId ? `request id ${error.requestId}` : "";
  if (error.status === 401) $("error-detail").textContent += " — enter the service's API key at the top right.";
  box.hidden = false;
}

function clearError() { $("error").hidden = true; }

async function guarded(action) {
  clearError();
  try { await action(); } catch (error) { showError(error); }
}

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "className") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function bar(p) {
  const node = el("span", { className: "bar" });
  node.style.width = `${(100 * p).toFixed(2)}%`;  // CSSOM: the page's CSP allows no inline style attributes
  return node;
}

// "1 hypothesis", "14 hypotheses".
const count = (n, one, many) => `${n} ${n === 1 ? one : many}`;
const fmt = (x) => (Number.isInteger(x) ? String(x) : Number(x).toPrecision(3).replace(/\.?0+$/, ""));
const percent = (p) => `${(100 * p).toFixed(p > 0 && p < 0.001 ? 2 : 1)}%`;

// --- instance -------------------------------------------------------------------------------

async function useInstance(summary) {
  page.instance = summary;
  const s = $("instance-summary");
  s.textContent = `Instance ${summary.instance_id.slice(0, 12)}…: ${summary.kind}, `
    + `${count(summary.n_hypotheses, "hypothesis", "hypotheses")}, ${count(summary.n_tests, "test", "tests")}, `
    + `${count(summary.n_classes, "class", "classes")}.`
    + (summary.warnings && summary.warnings.length ? ` Warnings: ${summary.warnings.join("; ")}` : "");
  s.hidden = false;
  $("session-form").hidden = false;
  $("session-area").hidden = true;
  await startSession();
}

// A new instance replaces the old one on screen at once: should it be refused, the error is not
// shown above a session that belongs to another instance.
function forgetInstance() {
  page.instance = null;
  page.session = null;
  page.etag = null;
  $("instance-summary").hidden = true;
  $("session-form").hidden = true;
  $("session-area").hidden = true;
}

const chooseInstance = (action) => guarded(async () => { forgetInstance(); await action(); });

async function postInstance(text) {
  const { data } = await api("POST", "/v1/instances", { body: text });
  await useInstance(data);
}

$("example-form").addEventListener("submit", (event) => {
  event.preventDefault();
  chooseInstance(async () => {
    const response = await fetch(document.querySelector('input[name="example"]:checked').value);
    if (!response.ok) throw new Error(`example not found (${response.status})`);
    await postInstance(await response.text());
  });
});

$("id-form").addEventListener("submit", (event) => {
  event.preventDefault();
  chooseInstance(async () => {
    const id = $("instance-id").value.trim();
    const { data } = await api("GET", `/v1/instances/${encodeURIComponent(id)}`);
    await useInstance(data);
  });
});

$("json-form").addEventListener("submit", (event) => {
  event.preventDefault();
  chooseInstance(() => postInstance($("instance-json").value));
});

$("instance-file").addEventListener("change", async () => {
  const file = $("instance-file").files[0];
  if (file) $("instance-json").value = await file.text();
});

// --- session --------------------------------------------------------------------------------

function sessionOptions() {
  const options = {};
  const policy = $("policy").value;
  if (policy) options.policy = policy;
  if ($("max-tests").value !== "") options.max_tests = Number.parseInt($("max-tests").value, 10);
  if ($("max-cost").value !== "") options.max_cost = Number($("max-cost").value);
  if ($("confidence").value !== "") options.confidence = Number($("confidence").value);
  return options;
}

async function startSession() {
  page.options = sessionOptions();
  const { data, etag } = await api("POST", "/v1/sessions?explain=true", {
    body: { instance_id: page.instance.instance_id, ...page.options },
    headers: { "Idempotency-Key": `ui-${crypto.randomUUID ? crypto.randomUUID() : Date.now() + Math.random()}` },
  });
  page.tree = null;
  page.treeSvg = null;
  show(data, etag);
  loadTree();
}

$("session-form").addEventListener("submit", (event) => {
  event.preventDefault();
  guarded(startSession);
});
$("restart").addEventListener("click", () => guarded(startSession));
$("delete").addEventListener("click", () => guarded(async () => {
  await api("DELETE", `/v1/sessions/${page.session.session_id}`, { headers: { "If-Match": page.etag } });
  page.session = null;
  $("session-area").hidden = true;
}));

async function changeSession(method, path, body) {
  try {
    const { data, etag } = await api(method, `/v1/sessions/${page.session.session_id}${path}?explain=true`,
      { body, headers: { "If-Match": page.etag } });
    show(data, etag);
  } catch (error) {
    if (error.status === 412) {  // changed elsewhere (another tab): show what it is now
      const { data, etag } = await api("GET", `/v1/sessions/${page.session.session_id}?explain=true`);
      show(data, etag);
    }
    throw error;
  }
}

const observe = (test, outcome) => guarded(() => changeSession("POST", "/observations", { test, outcome }));
const skip = (test) => guarded(() => changeSession("POST", "/observations", { test, skip: true }));
const undo = (test) => guarded(() => changeSession("DELETE", `/observations/${encodeURIComponent(test)}`));

function show(state, etag) {
  page.session = state;
  page.etag = etag;
  $("session-area").hidden = false;
  $("session-id").textContent = state.session_id;

  const banner = $("stop-banner");
  if (state.done) {
    const reason = STOP_REASONS[state.stop_reason] || state.stop_reason;
    const answer = state.decision ? `decision ${state.decision.id}` : `class ${state.map_class}`;
    banner.replaceChildren(el("strong", {}, "Session stopped: "), `${reason}. `,
      el("span", { className: "answer" }, `Result: ${answer}`), ` (stop reason: ${state.stop_reason})`);
  }
  banner.hidden = !state.done;

  const next = state.next_test;
  $("next").hidden = !next;
  if (next) {
    $("next-test").textContent = next.id;
    $("next-cost").textContent = `cost ${fmt(next.cost)}`;
    // The instance's display text when it gives one: the question, and each answer's wording
    // (the button still carries the outcome label it posts).
    $("next-text").textContent = next.text || "";
    $("next-text").hidden = !next.text;
    const wording = next.outcome_text || {};
    const buttons = next.outcomes.map((outcome) =>
      el("button", { type: "button", className: "outcome", "data-outcome": outcome, title: outcome, onclick: () => observe(next.id, outcome) },
        wording[outcome] || outcome));
    if (CONFIG.features.skip) {
      buttons.push(el("button", { type: "button", className: "skip", onclick: () => skip(next.id) }, "Skip"));
    }
    $("outcomes").replaceChildren(...buttons);
  }

  const stats = [`step ${state.step}`, `cost spent ${fmt(state.cost_spent)}`, `policy ${state.policy}`];
  if (state.version_space_size !== null && state.version_space_size !== undefined) {
    stats.push(`${count(state.version_space_size, "hypothesis", "hypotheses")} still possible`);
  }
  $("stats").textContent = stats.join(" · ");

  // Decision instances answer with decision_posterior (probability each decision is acceptable)
  // and the decision to act on, which is shown apart: with losses it is the least expected loss,
  // which need not be the most probably acceptable decision.
  const decisions = state.decision_posterior;
  const posterior = decisions || state.class_posterior;
  const top = decisions ? null : state.map_class;
  showRecommendation(state.decision, decisions);
  $("posterior-title").textContent = decisions ? "Probability each decision is acceptable" : "Class posterior";
  $("posterior").replaceChildren(...Object.entries(posterior).map(([label, p]) =>
    el("div", { className: label === top ? "bar-row top" : "bar-row", "data-label": label },
      el("span", { className: "bar-label", title: label }, label),
      el("span", { className: "bar-track" }, bar(p)),
      el("span", { className: "bar-value" }, percent(p)))));

  const candidates = state.candidates || [];
  $("why").hidden = state.done || candidates.length === 0;
  $("candidates").replaceChildren(...candidates.map((c) =>
    el("tr", { className: next && c.test === next.id ? "chosen" : "" },
      el("td", {}, c.test), el("td", {}, fmt(c.score)), el("td", {}, fmt(c.cost)))));

  $("history").replaceChildren(...state.history.map((entry) => {
    const text = entry.skipped ? `${entry.test}: skipped` : `${entry.test}: ${entry.outcome}`;
    const item = el("li", {}, el("span", {}, text), el("span", { className: "cost" }, ` cost ${fmt(entry.cost)}`));
    if (CONFIG.features.corrections) {
      item.append(" ", el("button", { type: "button", className: "undo", onclick: () => undo(entry.test) }, "Undo"));
    }
    return item;
  }));
  highlightTree();
}

function showRecommendation(decision, decisions) {
  const box = $("recommendation");
  box.hidden = !decision;
  if (!decision) return;
  const others = Object.keys(decisions).length - 1;
  const why = decision.expected_loss !== null && decision.expected_loss !== undefined
    ? `The least expected loss of the ${count(others + 1, "decision", "decisions")}: ${fmt(decision.expected_loss)} `
      + "(the loss the instance gives this decision for each hypothesis still possible, weighted by its probability). "
      + "It need not be the decision most likely to be acceptable: the losses say how bad each wrong decision is."
    : "The decision most likely to be acceptable (the instance gives no losses).";
  box.replaceChildren(
    el("div", {}, "Recommended decision: ", el("span", { className: "decision", "data-decision": decision.id }, decision.id)),
    el("p", {}, why),
    el("p", {}, `Acceptable with probability ${percent(decision.probability)}.`));
}

// --- the policy tree ------------------------------------------------------------------------

async function loadTree() {
  const panel = $("tree-panel");
  const summary = page.instance;
  panel.hidden = summary.n_hypotheses > CONFIG.treeMaxHypotheses;
  if (panel.hidden) return;
  const params = new URLSearchParams({ policy: page.session.policy });
  for (const name of ["max_tests", "max_cost", "confidence"]) {
    if (page.options[name] !== undefined) params.set(name, page.options[name]);
  }
  const base = `/v1/instances/${summary.instance_id}/tree?${params}`;
  $("tree").replaceChildren();
  $("tree-note").textContent = "Drawing the tree…";
  try {
    const tree = (await api("GET", `${base}&format=json`)).data;
    const svgText = await (await api("GET", `${base}&format=svg`, { raw: true })).text();
    const svg = new DOMParser().parseFromString(svgText, "image/svg+xml").documentElement;
    if (svg.nodeName !== "svg") throw new Error("the tree could not be drawn");
    $("tree").classList.remove("fit");  // measured at its own size
    $("tree").replaceChildren(document.importNode(svg, true));
    page.tree = tree;
    page.treeSvg = $("tree").firstElementChild;
    // Shrunk to the panel when that keeps it readable; a wider tree scrolls, at its own size.
    fitTree(page.treeSvg.getBoundingClientRect().width <= FIT_TREE_UP_TO * $("tree").clientWidth);
    highlightTree();
  } catch (error) {
    const why = error.status === 501 ? "Graphviz is not installed on the server, so the tree cannot be drawn."
      : `The tree is not available: ${error.message}`;
    $("tree-note").textContent = why;
  }
}

const FIT_TREE_UP_TO = 1.8;

function fitTree(fit) {
  $("tree").classList.toggle("fit", fit);
  $("tree-zoom").textContent = fit ? "Actual size" : "Fit to panel";
  const current = page.treeSvg && page.treeSvg.querySelector("g.node.current");
  if (current && !fit) current.scrollIntoView({ block: "nearest", inline: "center" });
}

$("tree-zoom").addEventListener("click", () => fitTree(!$("tree").classList.contains("fit")));

function highlightTree() {
  if (!page.tree || !page.treeSvg || !page.session) return;
  // Walk the tree along the session's history: the node reached is where the session is.
  let node = page.tree.root;
  const path = [node.id];
  let pastTheCut = false;
  for (const entry of page.session.history) {
    if (node.truncated) { pastTheCut = true; break; }  // a likelihood tree is drawn to a depth
    const branch = node.test === entry.test && !entry.skipped
      ? (node.branches || []).find((b) => b.outcome === entry.outcome) : null;
    if (!branch) { node = null; break; }
    node = branch.node;
    path.push(node.id);
  }
  const onPath = new Set(path);
  for (const g of page.treeSvg.querySelectorAll("g.node")) {
    const id = g.querySelector("title") && g.querySelector("title").textContent;
    g.classList.toggle("visited", onPath.has(id));
    g.classList.toggle("current", node !== null && id === node.id);
  }
  for (const g of page.treeSvg.querySelectorAll("g.edge")) {
    const [from, to] = (g.querySelector("title").textContent || "").split("->");
    g.classList.toggle("visited", onPath.has(from) && onPath.has(to));
  }
  const current = page.treeSvg.querySelector("g.node.current");
  if (current && !$("tree").classList.contains("fit")) current.scrollIntoView({ block: "nearest", inline: "center" });
  const base = `The ${page.tree.policy} policy's whole tree`
    + (page.tree.truncated_at_depth !== null ? `, drawn to depth ${page.tree.truncated_at_depth}` : "");
  if (pastTheCut) {
    $("tree-note").textContent = `${base}: the session has gone deeper than the tree is drawn.`;
  } else if (node === null) {
    $("tree-note").textContent = `${base}: this session has left it (a skipped or corrected answer, `
      + "or other stop rules); it shows the policy's plan from the start.";
  } else {
    $("tree-note").textContent = `${base}: the current node is highlighted.`;
  }
}

// --- the API key ----------------------------------------------------------------------------

const keyField = $("api-key");
keyField.value = sessionStorage.getItem(KEY_STORAGE) || "";
keyField.addEventListener("change", () => {
  if (keyField.value) sessionStorage.setItem(KEY_STORAGE, keyField.value);
  else sessionStorage.removeItem(KEY_STORAGE);
});
$("key-form").addEventListener("submit", (event) => event.preventDefault());
$("error-close").addEventListener("click", clearError);
