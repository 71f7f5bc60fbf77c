// The report page's behaviour (grpo/observe/report/page.py inlines it after the charts' script): the chart of any
// metric, the groups table's filters and sorting, and grpoSeries(), the series the charts hold and whether
// each was drawn, which the browser test (tests/test_report_browser.py) reads.
(function () {
  "use strict";

  function chartsDocument() {
    return window.Bokeh && Bokeh.documents.length ? Bokeh.documents[0] : null;
  }

  // ---- the chart of any metric: each run's steps and values of the chosen one ----
  const metrics = JSON.parse(document.getElementById("grpo-metrics").textContent);
  const select = document.getElementById("metric");

  function showMetric() {
    const doc = chartsDocument();
    if (!doc) return false;
    const series = metrics.metrics[select.value] || [];
    metrics.runs.forEach(function (run, i) {
      const source = doc.get_model_by_name("any-metric-" + i);
      const [x, y] = series[i] || [[], []];
      source.data = {x: x, y: y, run: x.map(() => run), series: x.map(() => select.value)};
    });
    return true;
  }

  select.addEventListener("change", showMetric);
  (function fillWhenReady() {  // the charts' document is built after the page has loaded
    if (!showMetric()) setTimeout(fillWhenReady, 50);
  })();

  // ---- what the charts drew: one entry per line, with its chart, colour, dash and number of points ----
  function drawnRenderers() {
    const drawn = new Set();
    const visit = function (view) {
      if (!view) return;
      if (view.model && view.model.glyph) drawn.add(view.model);
      for (const child of view.children ? view.children() : []) visit(child);
    };
    for (const root of Bokeh.index ? Bokeh.index.roots || Object.values(Bokeh.index) : []) visit(root);
    return drawn;
  }

  window.grpoSeries = function () {
    const doc = chartsDocument();
    if (!doc) return [];
    const drawn = drawnRenderers();
    const out = [];
    for (const model of doc.all_models) {
      if (!model.renderers || model.title === undefined) continue;  // a chart: its renderers are its series
      for (const r of model.renderers) {
        if (!r.glyph || r.glyph.type !== "Line") continue;
        out.push({chart: model.title ? model.title.text : model.name, name: r.name,
                  color: r.glyph.line_color, dash: r.glyph.line_dash, points: r.data_source.data.x.length,
                  visible: r.visible, drawn: drawn.has(r)});
      }
    }
    return out;
  };

  // ---- the groups table: filters and sorting ----
  const table = document.getElementById("groups");
  if (!table) return;
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  rows.forEach((row, i) => { row.dataset.order = i; });
  const field = (id) => document.getElementById(id).value;

  function keep(row) {
    const d = row.dataset;
    const min = field("f-reward-min"), max = field("f-reward-max");
    const advantage = d.advantage === "" ? NaN : Number(d.advantage);
    return (field("f-run") === "" || d.run === field("f-run"))
      && (field("f-step") === "" || Number(d.step) === Number(field("f-step")))
      && (min === "" || Number(d.reward) >= Number(min)) && (max === "" || Number(d.reward) <= Number(max))
      && (field("f-sign") === "" || Math.sign(advantage) === Number(field("f-sign")))
      && (field("f-cut") === "" || (d.cut !== "" && Number(d.cut) === Number(field("f-cut"))));
  }

  function filter() {
    let shown = 0;
    for (const row of rows) {
      row.hidden = !keep(row);
      shown += row.hidden ? 0 : 1;
    }
    document.getElementById("groups-shown").textContent = shown + " of " + rows.length + " completions shown";
  }

  let sortedBy = null, direction = 1;
  function sortBy(key) {
    direction = sortedBy === key ? -direction : 1;
    sortedBy = key;
    const value = (row) => (row.dataset[key] === "" ? -Infinity : Number(row.dataset[key]));
    // ties keep the written order, so a group's rows stay together under a sort by step or group
    rows.sort((a, b) => direction * (value(a) - value(b)) || a.dataset.order - b.dataset.order);
    for (const row of rows) body.appendChild(row);
    table.dataset.sortedBy = key + (direction > 0 ? " ascending" : " descending");
  }

  for (const th of table.tHead.rows[0].cells) {
    if (th.dataset.key) th.addEventListener("click", () => sortBy(th.dataset.key));
  }
  for (const id of ["f-run", "f-step", "f-reward-min", "f-reward-max", "f-sign", "f-cut"]) {
    document.getElementById(id).addEventListener("input", filter);
  }
  filter();
})();
