// The report page's script (ckpteval.report.page inlines it after the data it reads).
// Charts: Vega-Lite specs rendered by vega-embed. Per-sample data: gzip+base64 blobs in
// <script type="application/json" id="blob-..."> elements, inflated only when a view needs them.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("report-data").textContent);
  // deltas.csv's rows come as columns (field -> values, names once): back to row objects.
  D.deltas = Array.from({ length: (D.deltas.run || []).length }, (_, i) =>
    Object.fromEntries(Object.entries(D.deltas).map(([name, values]) => [name, values[i]])));
  const cache = new Map();
  const MAX_FLIPS = 50;

  function esc(value) {
    return String(value === null || value === undefined ? "" : value).replace(
      /[&<>"']/g,
      (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c],
    );
  }
  function fmt(value, digits = 3) {
    return value === null || value === undefined ? "" : Number(value).toFixed(digits);
  }
  function pval(value) {
    return value === null || value === undefined ? "" : Number(value).toPrecision(3);
  }
  function slug(text) {
    return String(text).replace(/[^\w.-]+/g, "_");
  }

  // Blobs ------------------------------------------------------------------------------------
  // A large report keeps its blobs in files beside it (D.blob_dir/<id>.js, each calling
  // ckptevalBlobText): loaded by a script tag when first needed, which works from file://
  // where fetch() does not.
  const pending = new Map();
  window.ckptevalBlobText = (id, text) => {
    const resolve = pending.get(id);
    if (resolve) { pending.delete(id); resolve(text); }
  };
  function blobText(id) {
    const node = document.getElementById("blob-" + id);
    if (node) return Promise.resolve(node.textContent);
    if (!D.blob_dir || !(D.blob_ids || []).includes(id)) return Promise.resolve(null);
    return new Promise((resolve) => {
      pending.set(id, resolve);
      const tag = document.createElement("script");
      tag.src = `${D.blob_dir}/${encodeURIComponent(id)}.js`;
      tag.onerror = () => { pending.delete(id); resolve(null); };
      document.head.appendChild(tag);
    });
  }
  async function inflate(id) {
    const text = await blobText(id);
    if (text === null) return null;
    const bytes = Uint8Array.from(atob(text.trim()), (c) => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return JSON.parse(await new Response(stream).text());
  }
  function blob(id) {
    if (!cache.has(id)) cache.set(id, inflate(id));
    return cache.get(id);
  }
  window.ckptevalBlob = blob; // for tests and the console

  // Overview ---------------------------------------------------------------------------------
  const mainMetric = Object.fromEntries(D.tasks.map((t) => [t.task, t.metric]));
  const several = new Set(D.series.map((r) => r.sampling)).size > 1;
  function seriesName(r) {
    return several ? `${r.run} · ${r.sampling}` : r.run;
  }
  const dkey = (run, task, sampling, ckpt) => [run, task, sampling, ckpt].join("\u0000");
  const previous = new Map(D.deltas.filter((d) => d.comparison === "previous")
    .map((d) => [dkey(d.run, d.task, d.sampling, d.ckpt), d]));
  function previousDelta(r) {
    return previous.get(dkey(r.run, r.task, r.sampling, r.ckpt));
  }
  let mainCache = null;
  function mainRows() {
    if (!mainCache) mainCache = computeMainRows();
    return mainCache;
  }
  function computeMainRows() {
    return D.series
      .filter((r) => r.metric === mainMetric[r.task])
      .map((r) => {
        const d = previousDelta(r);
        return { ...r, series: seriesName(r), drop: !!(d && d.regression) };
      });
  }

  function renderFlags() {
    const box = document.getElementById("flags");
    if (!D.flags.length) {
      box.innerHTML = "<p class='good'>No regression, truncated score, reward hack or missing file.</p>";
      return;
    }
    const kinds = { regression: "Regressions", truncation: "Truncated scores (lower bounds)",
      hack: "Reward hacks", reward_errors: "Reward function errors (how each number counts them)",
      missing: "Missing or unusable files", broken: "Broken checkpoints",
      waiting: "Checkpoints being written" };
    let out = "";
    for (const [kind, heading] of Object.entries(kinds)) {
      const items = D.flags.filter((f) => f.kind === kind);
      if (!items.length) continue;
      const list = `<ul class='flags'>${items.map((f) => `<li>${flagLink(f)}</li>`).join("")}</ul>`;
      out += `<details class='flag-group' data-kind='${kind}'${items.length <= 8 ? " open" : ""}>` +
        `<summary class='bad'>${heading} (${items.length})</summary>${list}</details>`;
    }
    box.innerHTML = out;
    box.querySelectorAll("a[data-pair]").forEach((a) =>
      a.addEventListener("click", () => openCompare(...JSON.parse(a.dataset.pair))));
  }
  function flagLink(f) {
    if (f.kind === "regression") {
      const pair = esc(JSON.stringify([`${f.task}|${f.sampling}`, `${f.run}:${f.a}`, `${f.run}:${f.b}`]));
      return `<a href='#compare' data-pair='${pair}'>${esc(f.text)}</a>`;
    }
    if (f.task && (f.kind === "truncation" || f.kind === "hack" || f.kind === "reward_errors")) {
      return `<a href='#task-${esc(slug(f.task))}'>${esc(f.text)}</a>`;
    }
    return `<a href='#tables'>${esc(f.text)}</a>`;
  }

  // `points`: a marker per checkpoint on the curve (the hover target of its value). The
  // overview leaves them out above DENSE checkpoints per curve: at 1,000 checkpoints x 20 tasks
  // drawing 20,000 markers took most of its time, and the table below holds every value.
  function curveLayers(y, title, tooltip, points = true) {
    const color = { field: "series", type: "nominal", title: "run" };
    const trained = { filter: "!datum.is_baseline && datum.step !== null" };
    return [
      { transform: [trained], mark: { type: "area", opacity: 0.2 },
        encoding: { x: { field: "step", type: "quantitative", title: "training step" },
          y: { field: "lo", type: "quantitative", title }, y2: { field: "hi" }, color } },
      { transform: [trained], mark: { type: "line", point: points },
        encoding: { x: { field: "step", type: "quantitative" }, y: { field: y, type: "quantitative" },
          color, tooltip } },
      { transform: [{ filter: "datum.is_baseline" }], mark: { type: "rule", strokeDash: [4, 3] },
        encoding: { y: { field: y, type: "quantitative" }, color, tooltip } },
      { transform: [{ filter: "datum.drop === true" }],
        mark: { type: "point", shape: "triangle-down", size: 90, filled: true, color: "#d62728" },
        encoding: { x: { field: "step", type: "quantitative" }, y: { field: y, type: "quantitative" },
          tooltip } },
    ];
  }
  const TOOLTIP = [
    { field: "run" }, { field: "ckpt" }, { field: "step" }, { field: "task" }, { field: "sampling" },
    { field: "metric" }, { field: "mean", title: "value", format: ".4f" },
    { field: "lo", title: "95% low", format: ".4f" }, { field: "hi", title: "95% high", format: ".4f" },
    { field: "n" }, { field: "seeds" },
  ];
  // A chart with a value whose reward function errored on some samples shows, on hover, what
  // each value does with them ("none" for the values without).
  function withErrors(rows, tooltip) {
    if (!rows.some((r) => r.errors)) return [rows, tooltip];
    return [rows.map((r) => (r.errors ? r : { ...r, errors: "none" })),
      [...tooltip, { field: "errors", title: "errored samples" }]];
  }
  function embed(el, spec) {
    spec.$schema = "https://vega.github.io/schema/vega-lite/v5.json";
    // logLevel Error: a facet panel whose layer has no rows (no drop there) warns of an empty extent.
    return vegaEmbed(el, spec, { actions: false, renderer: "canvas", logLevel: vega.Error });
  }
  function renderGrid() {
    const rows = mainRows();
    if (!rows.length) {
      document.getElementById("grid").innerHTML = "<p>No scored cells.</p>";
      return Promise.resolve();
    }
    const [thin, points] = thinned(rows);
    const [values, tooltip] = withErrors(thin, TOOLTIP);
    if (!points) {
      document.getElementById("grid").insertAdjacentHTML("beforebegin", "<p class='note' " +
        `id='grid-dense'>More than ${DENSE} checkpoints per curve: drawn without a marker per ` +
        `checkpoint, through the lowest and the highest value of each of ${BUCKETS} equal ` +
        "stretches of steps (every drop and baseline kept); the table below has every value.</p>");
    }
    return embed("#grid", {
      data: { values },
      facet: { field: "task", type: "nominal", title: null, sort: D.tasks.map((t) => t.task) },
      columns: 4,
      spec: { width: 240, height: 140, layer: curveLayers("mean", "main metric", tooltip, points) },
      resolve: { scale: { y: "independent" } },
    });
  }

  const DENSE = 150;
  const BUCKETS = 120;
  // The small multiples' rows, and whether each checkpoint gets a marker. A curve of more than
  // DENSE checkpoints keeps, per BUCKETS equal stretches of its steps, the rows of its lowest
  // and its highest value (a panel is 240 pixels wide: the same line to the eye), plus every
  // baseline, drop and row without a step: at 1,000 checkpoints x 20 tasks Vega's dataflow
  // over every row was most of the overview's time.
  function thinned(rows) {
    const curves = new Map();
    for (const r of rows) {
      const key = `${r.task}\u0000${r.series}`;
      if (!curves.has(key)) curves.set(key, []);
      curves.get(key).push(r);
    }
    if (Math.max(...Array.from(curves.values(), (c) => c.length)) <= DENSE) return [rows, true];
    const kept = new Set();
    for (const curve of curves.values()) {
      const steps = curve.filter((r) => r.step !== null).map((r) => r.step);
      const low = Math.min(...steps), span = Math.max(...steps) - low || 1;
      const lowest = new Map(), highest = new Map();
      for (const r of curve) {
        if (r.is_baseline || r.drop || r.step === null || r.mean === null) { kept.add(r); continue; }
        const b = Math.min(BUCKETS - 1, Math.floor(((r.step - low) / span) * BUCKETS));
        if (!lowest.has(b) || r.mean < lowest.get(b).mean) lowest.set(b, r);
        if (!highest.has(b) || r.mean > highest.get(b).mean) highest.set(b, r);
      }
      for (const r of [...lowest.values(), ...highest.values()]) kept.add(r);
    }
    return [rows.filter((r) => kept.has(r)), false];
  }

  // Checkpoint x task table ------------------------------------------------------------------
  function renderMatrix() {
    const rows = mainRows();
    const byKey = new Map();
    for (const r of rows) {
      const key = `${r.run}|${r.ckpt}|${r.task}`;
      if (!byKey.has(key)) byKey.set(key, r);
    }
    const range = {};
    for (const t of D.tasks) {
      const v = rows.filter((r) => r.task === t.task && r.mean !== null).map((r) => r.mean);
      range[t.task] = [Math.min(...v), Math.max(...v)];
    }
    let head = "<tr><th data-col='step' class='sortable'>checkpoint</th>";
    head += D.tasks.map((t) => `<th data-col='${esc(t.task)}' class='sortable'>${esc(t.task)}<br><small>${esc(t.metric)}</small></th>`).join("");
    const rowsHtml = (checkpoints) => checkpoints.map((c) => matrixRow(c, byKey, range)).join("");
    const box = document.getElementById("matrix");
    box.innerHTML = `<table id='ckpt-task'><thead>${head}</tr></thead>` +
      `<tbody>${rowsHtml(D.checkpoints.slice(0, FIRST_ROWS))}</tbody></table>`;
    // The rows past the first screenful: added MORE_ROWS at a time as the reader scrolls near
    // the table's end, and all of them before a sort (at 1,000 checkpoints x 20 tasks the
    // table's 20,000 cells cost the browser a second before the overview showed).
    const tbody = box.querySelector("tbody");
    let shown = Math.min(FIRST_ROWS, D.checkpoints.length);
    const more = (count) => {
      const next = D.checkpoints.slice(shown, shown + count);
      shown += next.length;
      if (next.length) tbody.insertAdjacentHTML("beforeend", rowsHtml(next));
      return shown < D.checkpoints.length;
    };
    const observer = new IntersectionObserver((entries) => {
      if (!entries.some((e) => e.isIntersecting)) return;
      observer.disconnect();
      if (more(MORE_ROWS)) observer.observe(tbody.lastElementChild);
    }, { rootMargin: "1500px" });
    if (shown < D.checkpoints.length) observer.observe(tbody.lastElementChild);
    box.querySelectorAll("th.sortable").forEach((th) => th.addEventListener("click", () => {
      observer.disconnect();
      more(Infinity);
      sortBy(th);
    }));
    box.addEventListener("click", (e) => {
      const td = e.target.closest("td[data-prov]");
      if (td) showProvenance(td.dataset.prov);
    });
  }
  const FIRST_ROWS = 100;
  const MORE_ROWS = 200;
  function matrixRow(c, byKey, range) {
    const step = c.step === null ? -1 : c.step;
    let tr = `<tr data-run='${esc(c.run)}' data-ckpt='${esc(c.ckpt)}'><td data-value='${step}'>${esc(c.run)} ${esc(c.ckpt)}${c.is_baseline ? " (baseline)" : ""}</td>`;
    for (const t of D.tasks) {
      const r = byKey.get(`${c.run}|${c.ckpt}|${t.task}`);
      if (!r || r.mean === null) { tr += "<td data-value='' class='empty'>–</td>"; continue; }
      const [lo, hi] = range[t.task];
      const share = hi > lo ? (r.mean - lo) / (hi - lo) : 0.5;
      const d = previousDelta(r);
      const mark = d && d.significant ? (d.delta > 0 ? " ▲" : " ▼") : "";
      const title = d ? `vs ${d.ref_ckpt}: ${fmt(d.delta)} [${fmt(d.ci_low)}, ${fmt(d.ci_high)}], McNemar p ${pval(d.mcnemar_p)}, Holm p ${pval(d.p_holm)}` : `n ${r.n}`;
      const cls = mark === " ▼" ? "sig down" : mark ? "sig up" : "";
      // A value whose reward function gave no score for some samples: marked, with what the
      // number does with them (the aggregate's words for this cell, not a fixed sentence).
      const warn = r.errors ? ` ⚠ <small>${esc(r.errors_mark || "")}</small>` : "";
      const note = r.errors ? `; ${r.errors}` : "";
      tr += `<td data-value='${r.mean}' data-prov='${esc(`${c.run}|${c.ckpt}|${t.task}`)}' class='${cls}' title='${esc(title + note)}' style='background:${heat(share)}'>${fmt(r.mean)}${mark}${warn}</td>`;
    }
    return tr + "</tr>";
  }
  function heat(share) {
    return `hsl(${Math.round(share * 120)}, 70%, ${88 - Math.round(share * 10)}%)`;
  }
  function sortBy(th) {
    const table = th.closest("table");
    const index = Array.from(th.parentNode.children).indexOf(th);
    const down = th.dataset.order !== "desc";
    table.querySelectorAll("th").forEach((h) => delete h.dataset.order);
    th.dataset.order = down ? "desc" : "asc";
    const body = table.tBodies[0];
    const rows = Array.from(body.rows);
    const value = (row) => {
      const v = row.cells[index].dataset.value;
      return v === "" ? -Infinity : Number(v);
    };
    rows.sort((a, b) => (down ? value(b) - value(a) : value(a) - value(b)));
    rows.forEach((row) => body.appendChild(row));
  }
  // Provenance: a blob per task (D.provenance: task -> blob id), "run|ckpt|task" -> cells.
  async function provenanceTable(task) {
    return (D.provenance[task] && (await blob(D.provenance[task]))) || {};
  }
  async function showProvenance(key) {
    const box = document.getElementById("provenance");
    const [run, ckpt, task] = key.split("|");
    const cells = (await provenanceTable(task))[key] || [];
    box.innerHTML = `<button class='close'>×</button><h4>${esc(`${run} ${ckpt} ${task}`)}: provenance</h4>` +
      cells.map(provenanceItem).join("");
    box.hidden = false;
    box.querySelector(".close").addEventListener("click", () => { box.hidden = true; });
  }
  function provenanceItem(p) {
    return `<dl class='prov'><dt>cell file</dt><dd><code>${esc(p.source)}</code> (${esc(p.variant)})</dd>` +
      `<dt>generation file</dt><dd><code>${esc(p.generation_file)}</code></dd>` +
      `<dt>model hash</dt><dd><code>${esc(p.model_hash)}</code></dd>` +
      `<dt>scorer</dt><dd>${esc(p.scorer_version)} · checker ${esc(p.checker)}</dd>` +
      (p.sandbox ? `<dt>sandbox</dt><dd>${esc(p.sandbox)}</dd>` : "") +
      `<dt>settings</dt><dd><code>${esc(JSON.stringify(p.scoring))}</code></dd>` +
      `<dt>chat template</dt><dd><code>${esc(JSON.stringify(p.chat_template))}</code></dd></dl>`;
  }

  // Per task ---------------------------------------------------------------------------------
  function renderTasks() {
    const box = document.getElementById("task-panels");
    box.innerHTML = D.tasks.map((t) =>
      `<div class='task-panel' id='task-${esc(slug(t.task))}' data-task='${esc(t.task)}'>` +
      `<h3>${esc(t.task)} <small>${esc(t.metric)}</small></h3><div class='charts'>` +
      ["metric", "sources", "training", "errors", "lengths", "truncation", "hacks"].map((k) => `<div class='chart' data-chart='${k}'></div>`).join("") +
      "</div></div>").join("");
    const observer = new IntersectionObserver((entries) => {
      for (const e of entries) {
        if (e.isIntersecting) { observer.unobserve(e.target); drawTask(e.target); }
      }
    }, { rootMargin: "400px" });
    box.querySelectorAll(".task-panel").forEach((p) => observer.observe(p));
  }
  function sideRows(task, metrics) {
    return D.series.filter((r) => r.task === task && metrics.includes(r.metric))
      .map((r) => ({ ...r, series: metrics.length > 1 ? `${seriesName(r)} ${r.metric}` : seriesName(r) }));
  }
  // A reward task's val-core/<data_source>/reward/mean@N rows, one line per run and source.
  function sourceRows(task) {
    return D.series.filter((r) => r.task === task && r.metric.startsWith("val-core/"))
      .map((r) => ({ ...r, series: `${seriesName(r)} ${r.metric.split("/").slice(1, -2).join("/")}` }));
  }
  function drawTask(panel) {
    const task = panel.dataset.task;
    const charts = {
      metric: [mainRows().filter((r) => r.task === task), `${mainMetric[task]}`],
      sources: [sourceRows(task), "reward per data source"],
      lengths: [sideRows(task, ["completion_tokens_mean", "reasoning_tokens_mean"]), "tokens per sample"],
      truncation: [sideRows(task, ["truncation_rate", "truncated_reasoning_rate"]), "share cut at the budget"],
      hacks: [sideRows(task, ["hack_rate"]), "hack rate"],
    };
    const jobs = [drawTraining(panel, task)];
    for (const [kind, [rows, title]] of Object.entries(charts)) {
      const el = panel.querySelector(`[data-chart='${kind}']`);
      if (!rows.length) { el.remove(); continue; }
      const [values, tooltip] = withErrors(rows, TOOLTIP);
      jobs.push(embed(el, { title: `${task}: ${title}`, width: 420, height: 180,
        data: { values }, layer: curveLayers("mean", title, tooltip) }));
    }
    jobs.push(drawErrors(panel, task));
    panel.dataset.drawn = "pending";
    return Promise.all(jobs).then(() => { panel.dataset.drawn = "yes"; });
  }
  // ckpteval's value (line, 95% band) beside the validation curve the trainer logged (dashed)
  // at the same steps; red crosses: outside ckpteval's interval with every setting matching.
  function drawTraining(panel, task) {
    const el = panel.querySelector("[data-chart='training']");
    const rows = (D.training || []).filter((r) => r.task === task);
    if (!rows.length) { el.remove(); return Promise.resolve(); }
    const x = { field: "step", type: "quantitative", title: "training step" };
    const color = { field: "series", type: "nominal", title: "curve" };
    const dash = { condition: { test: "indexof(datum.series, 'trainer') === 0", value: [5, 3] }, value: [1, 0] };
    const tooltip = [{ field: "series" }, { field: "step" }, { field: "metric" },
      { field: "mean", title: "value", format: ".4f" }, { field: "lo", title: "95% low", format: ".4f" },
      { field: "hi", title: "95% high", format: ".4f" }, { field: "settings" }, { field: "flagged" }];
    return embed(el, { title: `${task}: beside the trainer's logged curve`, width: 420, height: 180,
      data: { values: rows }, layer: [
        { transform: [{ filter: "indexof(datum.series, 'ckpteval') === 0" }], mark: { type: "area", opacity: 0.2 },
          encoding: { x, y: { field: "lo", type: "quantitative", title: "value" }, y2: { field: "hi" }, color } },
        { mark: { type: "line", point: true },
          encoding: { x, y: { field: "mean", type: "quantitative" }, color, strokeDash: dash, tooltip } },
        { transform: [{ filter: "datum.flagged === true && indexof(datum.series, 'trainer') === 0" }],
          mark: { type: "point", shape: "cross", size: 120, filled: true, color: "#d62728" },
          encoding: { x, y: { field: "mean", type: "quantitative" }, tooltip } },
      ] });
  }
  function drawErrors(panel, task) {
    const el = panel.querySelector("[data-chart='errors']");
    const rows = D.errors.filter((r) => r.task === task).map((r) => ({ ...r, label: `${r.run} ${r.ckpt}` }));
    if (!rows.length) { el.remove(); return Promise.resolve(); }
    return embed(el, { title: `${task}: error types`, width: 420, height: 180, data: { values: rows },
      mark: "bar",
      encoding: { x: { field: "label", type: "ordinal", sort: null, title: "checkpoint" },
        y: { field: "fraction", type: "quantitative", stack: true, title: "fraction of samples" },
        color: { field: "error_type", type: "nominal" },
        tooltip: [{ field: "run" }, { field: "ckpt" }, { field: "step" }, { field: "error_type" },
          { field: "fraction", format: ".3f" }] } });
  }

  // Compare two checkpoints ------------------------------------------------------------------
  const groupKey = (g) => `${g.task}|${g.sampling}`;
  function fillGroups(select) {
    select.innerHTML = D.groups.map((g) => `<option value='${esc(groupKey(g))}'>${esc(`${g.task} · ${g.sampling}`)}</option>`).join("");
  }
  function group(key) {
    return D.groups.find((g) => groupKey(g) === key);
  }
  function fillCkpts(g, a, b) {
    const options = g.ckpts.map((c) => `<option value='${esc(c)}'>${esc(c)}</option>`).join("");
    const sa = document.getElementById("cmp-a"), sb = document.getElementById("cmp-b");
    sa.innerHTML = options; sb.innerHTML = options;
    sa.value = a || g.ckpts[Math.max(0, g.ckpts.length - 2)];
    sb.value = b || g.ckpts[g.ckpts.length - 1];
  }
  function initCompare() {
    const sg = document.getElementById("cmp-group");
    if (!D.groups.length) {
      const out = document.getElementById("cmp-out");
      out.textContent = "No scored cells.";
      out.dataset.state = "ready";
      return;
    }
    fillGroups(sg);
    let start = [groupKey(D.groups[0]), null, null];
    if (D.focus) {
      const [fa, fb, fg] = D.focus;  // fg: the task|sampling that changed most, if known
      const has = (x) => x.ckpts.includes(fa) && x.ckpts.includes(fb);
      const g = D.groups.find((x) => groupKey(x) === fg && has(x)) || D.groups.find(has);
      if (g) start = [groupKey(g), fa, fb];
    }
    sg.addEventListener("change", () => { fillCkpts(group(sg.value)); showFlips(); });
    document.getElementById("cmp-a").addEventListener("change", showFlips);
    document.getElementById("cmp-b").addEventListener("change", showFlips);
    sg.value = start[0];
    fillCkpts(group(start[0]), start[1], start[2]);
    showFlips();
  }
  function openCompare(key, a, b) {
    document.getElementById("cmp-group").value = key;
    fillCkpts(group(key), a, b);
    showFlips();
  }
  window.ckptevalCompare = openCompare;

  function solved(m, c, p) {
    return m.n[c][p] > 0 ? m.passed[c][p] / m.n[c][p] > 0.5 : null;
  }
  async function showFlips() {
    const g = group(document.getElementById("cmp-group").value);
    const a = document.getElementById("cmp-a").value, b = document.getElementById("cmp-b").value;
    const out = document.getElementById("cmp-out");
    out.dataset.state = "loading";
    const m = await blob(g.verdicts);
    const ia = g.ckpts.indexOf(a), ib = g.ckpts.indexOf(b);
    const flips = [];
    m.problems.forEach((id, p) => {
      const x = solved(m, ia, p), y = solved(m, ib, p);
      if (x !== null && y !== null && x !== y) flips.push({ id, direction: y ? "gained" : "lost" });
    });
    const prompts = (await blob(g.prompts)) || {};
    const [rowsA, rowsB] = await Promise.all([cellRows(g, ia), cellRows(g, ib)]);
    const gained = flips.filter((f) => f.direction === "gained").length;
    let html = `<p class='cmp-summary'>${esc(g.task)} (${esc(g.sampling)}), ${esc(a)} → ${esc(b)}: ` +
      `${m.problems.length} problems, <b>${gained} gained</b>, <b>${flips.length - gained} lost</b>.${deltaLine(g, a, b)}</p>`;
    const prov = await provenanceTable(g.task);
    html += flips.slice(0, MAX_FLIPS).map((f) => flipHtml(f, prompts, rowsA, rowsB, a, b, prov)).join("");
    if (flips.length > MAX_FLIPS) html += `<p class='note'>${flips.length - MAX_FLIPS} more flipped problems: see flips.csv.</p>`;
    out.innerHTML = html;
    out.dataset.state = "ready";
  }
  function deltaLine(g, a, b) {
    const [runA, ckptA] = a.split(/:(.*)/s), [runB, ckptB] = b.split(/:(.*)/s);
    const d = runA === runB && D.deltas.find((x) => x.run === runA && x.task === g.task &&
      x.sampling === g.sampling && x.ref_ckpt === ckptA && x.ckpt === ckptB);
    if (!d) return "";
    return ` Delta ${fmt(d.delta)} [${fmt(d.ci_low)}, ${fmt(d.ci_high)}] (95% paired bootstrap), McNemar p ${pval(d.mcnemar_p)}, Holm p ${pval(d.p_holm)}.`;
  }
  // A cell blob holds its score lines ("s") and generation lines ("g") as columns.
  const SHOWN = new Set(["task_id", "sample_idx", "passed", "score", "error_type", "stderr_tail", "hack"]);
  function joinCell(data, variant) {
    const s = data.s, g = data.g || {};
    const key = (id, idx) => `${id}\u0000${idx}`;
    const at = new Map((g.task_id || []).map((id, j) => [key(id, g.sample_idx ? g.sample_idx[j] : 0), j]));
    return (s.task_id || []).map((id, i) => {
      const row = { task_id: String(id), variant, note: data.note, extra: {} };
      for (const [name, values] of Object.entries(s)) {
        if (SHOWN.has(name)) row[name] = values[i];
        else row.extra[name] = values[i];
      }
      const j = at.get(key(id, s.sample_idx ? s.sample_idx[i] : 0));
      if (j !== undefined) for (const [name, values] of Object.entries(g)) if (!SHOWN.has(name)) row[name] = values[j];
      return row;
    });
  }
  async function cellRows(g, index) {
    const rows = [];
    for (const cell of g.cells[index] || []) {
      const data = await blob(cell.id);
      if (data) rows.push(...joinCell(data, cell.variant));
    }
    return rows;
  }
  function flipHtml(f, prompts, rowsA, rowsB, a, b, prov) {
    const side = (rows, label) => `<div class='side'><h5>${esc(label)}</h5>${provenanceOf(label, prov)}` +
      (rows.filter((r) => r.task_id === f.id).map(sampleHtml).join("") || "<p class='note'>no sample</p>") + "</div>";
    return `<div class='flip ${f.direction}' data-task-id='${esc(f.id)}'><h4>${esc(f.id)} <span class='tag'>${f.direction}</span></h4>` +
      promptHtml(prompts[f.id]) + `<div class='sides'>${side(rowsA, a)}${side(rowsB, b)}</div></div>`;
  }
  function provenanceOf(label, prov) {
    const [run, ckpt] = label.split(/:(.*)/s);
    const task = document.getElementById("cmp-group").value.split("|")[0];
    const cells = prov[`${run}|${ckpt}|${task}`] || [];
    return `<details class='prov-inline'><summary>provenance</summary>${cells.map(provenanceItem).join("")}</details>`;
  }
  function promptHtml(prompt, open = true) {
    if (prompt === undefined) return "<p class='note'>prompt not recorded</p>";
    const text = typeof prompt === "string" ? prompt : JSON.stringify(prompt, null, 1);
    return `<details class='prompt'${open ? " open" : ""}><summary>prompt</summary><pre>${esc(text)}</pre></details>`;
  }
  function sampleHtml(r) {
    const verdict = r.passed ? "<span class='pass'>passed</span>" : "<span class='fail'>failed</span>";
    const extra = r.extra || {};
    const failed = extra.first_failed_test !== undefined && extra.first_failed_test !== null
      ? `<div>first failed test: ${esc(extra.first_failed_set || "")} #${esc(extra.first_failed_test)}</div>` : "";
    const extras = Object.entries(extra)
      .filter(([k, v]) => !k.startsWith("first_failed") && v !== null && v !== "")
      .map(([k, v]) => `${esc(k)}: ${esc(v)}`).join(" · ");
    return `<div class='sample'><div class='verdict'>${verdict} ${r.error_type ? `<code>${esc(r.error_type)}</code>` : ""}` +
      ` <small>${esc(r.variant)} sample ${esc(r.sample_idx)}${r.finish_reason ? ` · ${esc(r.finish_reason)}` : ""}${r.hack ? ` · hack ${esc(r.hack)}` : ""}</small></div>` +
      failed + (extras ? `<div class='extras'>${extras}</div>` : "") +
      (r.reasoning ? `<details class='reasoning'><summary>reasoning</summary><pre>${esc(r.reasoning)}</pre></details>` : "") +
      `<pre class='completion'>${esc(r.completion !== undefined ? r.completion : r.note || "(no generation line)")}</pre>` +
      (r.stderr_tail ? `<details class='stderr' open><summary>stderr tail</summary><pre>${esc(r.stderr_tail)}</pre></details>` : "") +
      "</div>";
  }

  // Several checkpoints side by side -----------------------------------------------------------
  // Up to 6 checkpoints of one task: each one's score with its interval, each later one's delta
  // from deltas.csv when it is a comparison there (same run, the first being its baseline or
  // previous checkpoint; marks Holm-corrected as everywhere on the page), and the problems
  // whose verdicts differ among them, every verdict a button that loads its completions.
  const MAX_SEVERAL = 6;
  function defaultSeveral(g) {
    const trained = D.checkpoints.filter((c) => !c.is_baseline).map((c) => `${c.run}:${c.ckpt}`);
    const last = trained.length ? trained[trained.length - 1] : g.ckpts[g.ckpts.length - 1];
    const best = D.best && D.best.best;
    return [...new Set([g.ckpts[0], best, last])].filter((c) => c && g.ckpts.includes(c));
  }
  function initSeveral() {
    const sg = document.getElementById("sev-group");
    const out = document.getElementById("sev-out");
    if (!D.groups.length) { out.textContent = "No scored cells."; out.dataset.state = "ready"; return; }
    fillGroups(sg);
    const picks = document.getElementById("sev-ckpts");
    const fill = (chosen) => {
      const g = group(sg.value);
      const options = ["", ...g.ckpts].map((c) => `<option value='${esc(c)}'>${esc(c || "–")}</option>`).join("");
      picks.innerHTML = Array.from({ length: MAX_SEVERAL }, (_, i) => `<select data-slot='${i}'>${options}</select>`).join("");
      picks.querySelectorAll("select").forEach((s, i) => {
        s.value = chosen[i] || "";
        s.addEventListener("change", showSeveral);
      });
    };
    sg.addEventListener("change", () => { fill(defaultSeveral(group(sg.value))); showSeveral(); });
    fill(defaultSeveral(group(sg.value)));
    return showSeveral();
  }
  function severalChosen() {
    const values = Array.from(document.querySelectorAll("#sev-ckpts select")).map((s) => s.value);
    return [...new Set(values.filter((v) => v))];
  }
  function severalDelta(g, first, label) {
    const [runA, ckptA] = first.split(/:(.*)/s), [runB, ckptB] = label.split(/:(.*)/s);
    return runA === runB ? D.deltas.find((x) => x.run === runA && x.task === g.task &&
      x.sampling === g.sampling && x.ref_ckpt === ckptA && x.ckpt === ckptB) : undefined;
  }
  async function showSeveral() {
    const g = group(document.getElementById("sev-group").value);
    const chosen = severalChosen();
    const out = document.getElementById("sev-out");
    out.dataset.state = "loading";
    const m = await blob(g.verdicts);
    const index = chosen.map((c) => g.ckpts.indexOf(c));
    const metric = mainMetric[g.task];
    let html = `<table class='several'><thead><tr><th>checkpoint</th><th>${esc(metric)} [95% interval]</th>` +
      "<th>delta from the first [95% interval]</th><th>Holm p</th><th>mark</th></tr></thead><tbody>";
    chosen.forEach((label, i) => {
      const [run, ckpt] = label.split(/:(.*)/s);
      const r = D.series.find((x) => x.run === run && x.ckpt === ckpt && x.task === g.task &&
        x.sampling === g.sampling && x.metric === metric);
      const score = r ? `${fmt(r.mean)} [${fmt(r.lo)}, ${fmt(r.hi)}]` : "–";
      const tag = D.best && D.best.best === label ? " <span class='tag'>best</span>" : "";
      let rest = "<td>reference</td><td></td><td></td>";
      if (i) {
        const d = severalDelta(g, chosen[0], label);
        const mark = d && d.significant ? (d.delta > 0 ? "<span class='up'>▲</span>" : "<span class='down'>▼</span>") : "";
        rest = d ? `<td>${fmt(d.delta)} [${fmt(d.ci_low)}, ${fmt(d.ci_high)}]</td><td>${pval(d.p_holm)}</td><td>${mark}</td>`
          : "<td class='note'>not a comparison of deltas.csv (ckpteval compare pairs any two)</td><td></td><td></td>";
      }
      html += `<tr data-ckpt='${esc(label)}'><td>${esc(label)}${tag}</td><td>${score}</td>${rest}</tr>`;
    });
    html += "</tbody></table>";
    const differing = [];
    m.problems.forEach((id, p) => {
      const verdicts = index.map((c) => (c < 0 ? null : solved(m, c, p)));
      if (verdicts.every((v) => v !== null) && new Set(verdicts).size > 1) differing.push(p);
    });
    html += `<h3>Problems whose verdicts differ (${differing.length} of ${m.problems.length})</h3>`;
    if (chosen.length < 2) html += "<p class='note'>Choose two checkpoints or more.</p>";
    else if (!differing.length) html += "<p>None: every chosen checkpoint gives every problem they all scored one verdict.</p>";
    else {
      html += "<table class='several-problems'><thead><tr><th>problem</th>" +
        chosen.map((c) => `<th>${esc(c)}</th>`).join("") + "</tr></thead><tbody>";
      html += differing.slice(0, MAX_FLIPS * 4).map((p) => {
        const id = m.problems[p];
        return `<tr data-task-id='${esc(id)}'><td>${esc(id)}</td>` + index.map((c, i) => {
          const pass = m.passed[c][p], n = m.n[c][p];
          const cls = 2 * pass > n ? "pass" : "fail";
          return `<td><button class='verdict-cell ${cls}' data-slot='${i}' data-task-id='${esc(id)}'>` +
            `${pass}/${n} ${2 * pass > n ? "✓" : "✗"}</button></td>`;
        }).join("") + "</tr>";
      }).join("");
      html += "</tbody></table>";
      if (differing.length > MAX_FLIPS * 4) html += `<p class='note'>${differing.length - MAX_FLIPS * 4} more: see flips.csv or ckpteval compare.</p>`;
    }
    out.innerHTML = html;
    // A verdict's completions open in a row under its problem (the list can be long).
    out.querySelectorAll("button.verdict-cell").forEach((b) => b.addEventListener("click", async () => {
      const label = chosen[Number(b.dataset.slot)], id = b.dataset.taskId;
      const old = document.getElementById("sev-sample");
      if (old) old.closest("tr").remove();
      const row = b.closest("tr").insertAdjacentElement("afterend", document.createElement("tr"));
      row.innerHTML = `<td colspan='${chosen.length + 1}' id='sev-sample'></td>`;
      const box = document.getElementById("sev-sample");
      box.dataset.state = "loading";
      const rows = (await cellRows(g, g.ckpts.indexOf(label))).filter((r) => r.task_id === id);
      const prompts = (await blob(g.prompts)) || {};
      box.innerHTML = `<h4>${esc(id)} at ${esc(label)}</h4>` + promptHtml(prompts[id], false) +
        (rows.map(sampleHtml).join("") || "<p>no sample</p>");
      box.dataset.state = "ready";
    }));
    out.dataset.state = "ready";
  }

  // One problem across the run ---------------------------------------------------------------
  async function initProblem() {
    const sg = document.getElementById("prob-group");
    if (!D.groups.length) return;
    fillGroups(sg);
    const sp = document.getElementById("prob-id");
    const fill = async () => {
      const m = await blob(group(sg.value).verdicts);
      sp.innerHTML = m.problems.map((p) => `<option value='${esc(p)}'>${esc(p)}</option>`).join("");
      await showProblem();
    };
    sg.addEventListener("change", fill);
    sp.addEventListener("change", showProblem);
    await fill();
  }
  async function showProblem() {
    const g = group(document.getElementById("prob-group").value);
    const id = document.getElementById("prob-id").value;
    const m = await blob(g.verdicts);
    const p = m.problems.indexOf(id);
    const cells = g.ckpts.map((c, i) => {
      const n = m.n[i][p], share = n ? m.passed[i][p] / n : null;
      const cls = share === null ? "none" : share > 0.5 ? "pass" : "fail";
      return `<button class='verdict-cell ${cls}' data-index='${i}' title='${esc(`${c}: ${n ? `${m.passed[i][p]}/${n} passed` : "not scored"}`)}'>${esc(c)}<br>${n ? `${m.passed[i][p]}/${n}` : "–"}</button>`;
    }).join("");
    const out = document.getElementById("prob-out");
    out.innerHTML = `<div class='verdict-row'>${cells}</div><div id='prob-sample'></div>`;
    out.querySelectorAll(".verdict-cell").forEach((b) => b.addEventListener("click", async () => {
      const rows = (await cellRows(g, Number(b.dataset.index))).filter((r) => r.task_id === id);
      const prompts = (await blob(g.prompts)) || {};
      document.getElementById("prob-sample").innerHTML = `<h4>${esc(g.ckpts[b.dataset.index])}</h4>` +
        promptHtml(prompts[id]) + (rows.map(sampleHtml).join("") || "<p>no sample</p>");
    }));
  }

  // Large static tables are stored compressed and shown on demand.
  function initLazySections() {
    document.querySelectorAll(".lazy-section button").forEach((button) =>
      button.addEventListener("click", async () => {
        const box = button.parentNode;
        box.innerHTML = await blob(box.dataset.blob);
        box.dataset.shown = "yes";
      }));
  }

  // Start ------------------------------------------------------------------------------------
  performance.mark("ckpteval-script");
  // The script runs before the tables and the sample blobs are parsed: the overview first, the
  // views that read blobs once the document is complete.
  renderFlags();
  renderMatrix();
  const overview = renderGrid();
  const drill = new Promise((resolve) => document.addEventListener("DOMContentLoaded", resolve))
    .then(() => { renderTasks(); initCompare(); initLazySections(); return Promise.all([initSeveral(), initProblem()]); });
  window.ckptevalReady = Promise.all([overview, drill]).then(() => {
    document.body.dataset.ready = "yes";
  });
  overview.then(() => { document.body.dataset.overview = "yes"; });
})();
