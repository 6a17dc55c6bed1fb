// The dashboard's live part: poll data (same origin, the cookie) every POLL_MS, draw the figures as SVG and the
// table's rows as text. Every value goes in through textContent or an SVG attribute, never as HTML.
"use strict";
(function () {
  var POLL_MS = 2000;
  var SVG = "http://www.w3.org/2000/svg";
  var STATUS_ORDER = ["correct", "incorrect", "hacked", "compile_error", "runtime_error", "timeout", "crashed",
                      "invalid"];
  var form = document.getElementById("filters");
  var timer = null, latest = 0;

  function $(id) { return document.getElementById(id); }
  function text(id, value) { var el = $(id); if (el) { el.textContent = value; } }
  function cell(row, value, className) {
    var td = document.createElement("td");
    td.textContent = value === null || value === undefined ? "-" : String(value);
    if (className) { td.className = className; }
    row.appendChild(td);
    return td;
  }
  function svg(name, attrs) {
    var el = document.createElementNS(SVG, name);
    Object.keys(attrs).forEach(function (k) { el.setAttribute(k, attrs[k]); });
    return el;
  }
  function clear(el) { while (el.firstChild) { el.removeChild(el.firstChild); } }
  function clock(seconds) { return seconds ? new Date(seconds * 1000).toLocaleTimeString() : "-"; }
  function round(x) { return x === null || x === undefined ? "-" : (Math.round(x * 100) / 100).toString(); }

  function query() {
    var params = new URLSearchParams();
    new FormData(form).forEach(function (value, key) { if (value) { params.set(key, value); } });
    return params.toString();
  }

  function bars(el, columns, height, stacked) {
    // columns: [[{value, className}, ...], ...] one stack per column, drawn to the tallest stack
    clear(el);
    var width = el.viewBox.baseVal.width, tallest = 1;
    columns.forEach(function (stack) {
      tallest = Math.max(tallest, stack.reduce(function (s, part) { return s + part.value; }, 0));
    });
    var step = width / columns.length;
    columns.forEach(function (stack, i) {
      var y = height;
      stack.forEach(function (part) {
        if (!part.value) { return; }
        var h = height * part.value / tallest;
        y -= h;
        var rect = svg("rect", {x: i * step + 0.5, y: y, width: Math.max(step - 1, 0.5), height: h,
                                "class": part.className});
        rect.appendChild(svg("title", {})).textContent = part.title;
        el.appendChild(rect);
      });
    });
  }

  function drawLive(live) {
    text("queued", live.states.queued);
    text("running", live.states.running);
    text("done", live.states.done);
    var minutes = live.minutes;
    text("rate", minutes[minutes.length - 1].total);
    text("hour-total", live.finished_last_hour);
    text("hit-rate", live.cache_hit_rate === null ? "-" : Math.round(live.cache_hit_rate * 100) + "%");
    bars($("rate-chart"), minutes.map(function (m, i) {
      return [{value: m.total, className: "rate", title: (60 - i) + " min ago: " + m.total}];
    }), 60);
    var seen = {};
    bars($("status-chart"), minutes.map(function (m, i) {
      return STATUS_ORDER.map(function (s) {
        if (m.by_status[s]) { seen[s] = true; }
        return {value: m.by_status[s] || 0, className: "status-fill " + s,
                title: (60 - i) + " min ago: " + (m.by_status[s] || 0) + " " + s};
      });
    }), 100);
    var legend = $("status-legend");
    clear(legend);
    STATUS_ORDER.filter(function (s) { return seen[s]; }).forEach(function (s) {
      var item = document.createElement("span");
      item.className = "status " + s;
      item.textContent = s;
      legend.appendChild(item);
    });
    var workers = $("workers").tBodies[0];
    clear(workers);
    live.workers.forEach(function (w) {
      var tr = workers.insertRow();
      cell(tr, w.name); cell(tr, w.device); cell(tr, w.gpu);
      cell(tr, w.busy ? 1 : 0, w.busy ? "busy" : ""); cell(tr, w.inflight); cell(tr, w.completed); cell(tr, w.restarts);
    });
    var reasons = $("reasons").tBodies[0];
    clear(reasons);
    live.reasons.forEach(function (r) {
      var tr = reasons.insertRow();
      cell(tr, r.reason); cell(tr, r.total);
      var spark = svg("svg", {viewBox: "0 0 120 20", "class": "spark", preserveAspectRatio: "none"});
      bars(spark, r.buckets.map(function (n) { return [{value: n, className: "reason", title: String(n)}]; }), 20);
      cell(tr, "").appendChild(spark);
    });
    $("no-reasons").hidden = live.reasons.length > 0;
  }

  function drawRows(rows) {
    var body = $("rows").tBodies[0];
    clear(body);
    rows.forEach(function (r) {
      var tr = body.insertRow();
      tr.dataset.id = r.id;
      cell(tr, clock(r.finished_at));
      var status = cell(tr, "");
      var link = document.createElement("a");
      link.href = r.url;
      link.className = "status " + r.status;
      link.textContent = r.status;
      status.appendChild(link);
      cell(tr, r.task); cell(tr, r.group); cell(tr, r.reasons.join(" "), "reasons");
      cell(tr, round(r.speedup)); cell(tr, r.cached ? "yes" : "");
    });
    $("no-rows").hidden = rows.length > 0;
  }

  function poll() {
    clearTimeout(timer);
    if (document.hidden) { return; }  // a hidden tab costs the service nothing; it polls again once shown
    var q = query(), asked = ++latest;
    fetch(location.pathname + "/data" + (q ? "?" + q : ""), {credentials: "same-origin", cache: "no-store"})
      .then(function (answer) {
        if (!answer.ok) { throw new Error("HTTP " + answer.status); }
        return answer.json();
      })
      .then(function (data) {
        if (asked !== latest) { return; }  // the filters changed meanwhile: a newer answer is on its way
        if (data.live && $("live")) { drawLive(data.live); }
        drawRows(data.rows);
        text("updated", "updated " + new Date().toLocaleTimeString());
        document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
      })
      .catch(function (error) { text("updated", "not updated: " + error.message); })
      .then(function () { if (asked === latest) { timer = setTimeout(poll, POLL_MS); } });
  }

  document.addEventListener("visibilitychange", function () { if (!document.hidden) { poll(); } });

  function filtersChanged() {
    var q = query();
    history.replaceState(null, "", location.pathname + (q ? "?" + q : ""));
    poll();
  }

  new URLSearchParams(location.search).forEach(function (value, key) {
    if (form.elements[key]) { form.elements[key].value = value; }
  });
  form.addEventListener("change", filtersChanged);
  form.addEventListener("input", filtersChanged);
  form.addEventListener("submit", function (event) { event.preventDefault(); filtersChanged(); });
  poll();
}());
