// cdc-outbox lag dashboard: polls /api/lag and draws its charts on <canvas> (no libraries).
// Each figure element carries data-metric="<field>" and data-value="<raw value>" so that
// tests (and curious operators) can read the exact numbers behind the formatted text.
"use strict";

(function () {
  const WINDOW_S = 3600; // keep (and chart) the last hour
  const COLORS = { lag: "#5fb3f9", retained: "#f2b84b", rate: "#6ccf8e", p50: "#5fb3f9",
                   p95: "#f26d6d", age: "#c792ea", cdc: "#2f7fc1", polling: "#c1902f",
                   unknown: "#4b5563" };
  const state = { points: [], lastT: 0, refreshS: 2, current: null };

  // -- formatting ----------------------------------------------------------------------------
  function bytes(v) {
    if (v == null) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let x = Math.abs(v), i = 0;
    while (x >= 1024 && i < units.length - 1) { x /= 1024; i += 1; }
    const s = i === 0 ? String(Math.round(x)) : x.toFixed(x < 10 ? 2 : 1);
    return (v < 0 ? "-" : "") + s + " " + units[i];
  }
  function seconds(v) {
    if (v == null) return "–";
    if (v < 1) return (v * 1000).toFixed(v < 0.01 ? 2 : 0) + " ms";
    if (v < 120) return v.toFixed(1) + " s";
    if (v < 7200) return (v / 60).toFixed(1) + " min";
    return (v / 3600).toFixed(1) + " h";
  }
  function rate(v) { return v == null ? "–" : (v >= 100 ? v.toFixed(0) : v.toFixed(1)) + " /s"; }
  function count(v) { return v == null ? "–" : Number(v).toLocaleString("en-US"); }
  function clock(unix) {
    const d = new Date(unix * 1000);
    return d.toTimeString().slice(0, 8);
  }

  // -- figures -------------------------------------------------------------------------------
  function setFigure(name, value, text, cls) {
    for (const el of document.querySelectorAll('[data-metric="' + name + '"]')) {
      el.dataset.value = value == null ? "" : String(value);
      el.textContent = text;
      el.classList.remove("warn", "bad", "good");
      if (cls) el.classList.add(cls);
    }
  }

  function showCurrent(c) {
    const now = Date.now() / 1000;
    setFigure("slot_lag_bytes", c.slot_lag_bytes, bytes(c.slot_lag_bytes));
    setFigure("slot_retained_wal_bytes", c.slot_retained_wal_bytes, bytes(c.slot_retained_wal_bytes));
    const age = c.oldest_unpublished_age_seconds;
    setFigure("oldest_unpublished_age_seconds", age, seconds(age),
              age == null ? null : age > 300 ? "bad" : age > 30 ? "warn" : "good");
    const ws = c.slot_wal_status;
    setFigure("slot_wal_status", ws, ws == null ? (c.slot_present === false ? "no slot" : "–") : ws,
              ws === "lost" || ws === "unreserved" ? "bad" : ws === "extended" ? "warn" : ws ? "good" : null);
    setFigure("slot_safe_wal_size_bytes", c.slot_safe_wal_size_bytes,
              c.slot_safe_wal_size_bytes == null ? "unlimited" : bytes(c.slot_safe_wal_size_bytes));
    setFigure("slot_active", c.slot_active, c.slot_active == null ? "–" : c.slot_active ? "yes" : "no",
              c.slot_active == null ? null : c.slot_active ? "good" : "warn");
    setFigure("throughput_events_per_second", c.throughput_events_per_second, rate(c.throughput_events_per_second));
    setFigure("latency_p95_seconds", c.latency_p95_seconds, seconds(c.latency_p95_seconds));
    setFigure("in_flight_events", c.in_flight_events, count(c.in_flight_events));
    setFigure("events_published_total", c.events_published_total, count(c.events_published_total));
    setFigure("events_dead_lettered_total", c.events_dead_lettered_total, count(c.events_dead_lettered_total),
              c.events_dead_lettered_total ? "warn" : null);
    setFigure("delivery_errors_total", c.delivery_errors_total, count(c.delivery_errors_total),
              c.delivery_errors_total ? "warn" : null);
    setFigure("last_confirm_unix", c.last_confirm_unix,
              c.last_confirm_unix == null ? "never" : seconds(Math.max(0, now - c.last_confirm_unix)) + " ago");
    setFigure("heartbeats_total", c.heartbeats_total, c.heartbeats_total == null ? "off"
              : count(c.heartbeats_total) + " (" + count(c.heartbeat_errors_total) + ")",
              c.heartbeat_errors_total ? "warn" : null);
    setFigure("slot_spill_txns", c.slot_spill_txns, count(c.slot_spill_txns));
    setFigure("polling_pending", c.polling_pending, c.polling_pending == null ? "n/a" : count(c.polling_pending));
    setFigure("wal_lsn", c.wal_lsn, c.wal_lsn || "–");
    setFigure("confirmed_flush_lsn", c.confirmed_flush_lsn, c.confirmed_flush_lsn || "–");
    setFigure("restart_lsn", c.restart_lsn, c.restart_lsn || "–");
    setFigure("sampled_at", c.sampled_at, clock(c.sampled_at));
    const badge = document.querySelector(".badge");
    setFigure("mode", c.mode, c.mode || "?");
    setFigure("role", c.role, (c.role || "?") + (c.phase ? " · " + c.phase : ""),
              c.role === "standby" ? "warn" : null);
    setFigure("delivery", c.delivery, c.delivery === "exactly_once" ? "exactly-once"
              : c.delivery === "at_least_once" ? "at-least-once" : "?", null);
    badge.className = "badge " + (c.mode || "");
    document.getElementById("slot-name").textContent = c.slot_name;
    showOutboxes(c.outboxes || []);
    const err = document.getElementById("db-error");
    err.hidden = !c.error;
    err.textContent = c.error ? "database: " + c.error : "";
  }

  // One row per outbox table (schema.table) the monitor samples.
  function showOutboxes(outboxes) {
    const body = document.querySelector("#outboxes tbody");
    body.replaceChildren(...outboxes.map((o) => {
      const row = document.createElement("tr");
      row.dataset.outbox = o.outbox;
      const age = o.oldest_unpublished_age_seconds;
      const cells = [
        [o.outbox, null],
        [o.exists ? count(o.unpublished_rows) : "missing", o.exists ? null : "bad"],
        [age == null ? "n/a" : seconds(age), age == null ? null : age > 300 ? "bad" : age > 30 ? "warn" : "good"],
        [o.failed_rows == null ? "n/a" : count(o.failed_rows), o.failed_rows ? "warn" : null],
        [o.parked_aggregates == null ? "n/a" : count(o.parked_aggregates), o.parked_aggregates ? "warn" : null],
      ];
      for (const [text, cls] of cells) {
        const td = document.createElement("td");
        td.textContent = text;
        if (cls) td.classList.add(cls);
        row.appendChild(td);
      }
      return row;
    }));
  }

  // -- charts --------------------------------------------------------------------------------
  function setupCanvas(canvas) {
    const ratio = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || 480, h = canvas.clientHeight || 200;
    if (canvas.width !== Math.round(w * ratio) || canvas.height !== Math.round(h * ratio)) {
      canvas.width = Math.round(w * ratio);
      canvas.height = Math.round(h * ratio);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    return { ctx, w, h };
  }

  function timeRange(points) {
    if (!points.length) return [0, 1];
    const t1 = points[points.length - 1].t, t0 = points[0].t;
    return [t0, t1 > t0 ? t1 : t0 + 1];
  }

  function niceMax(v, binary) {
    if (!(v > 0)) return 1;
    if (binary && v >= 1024) {
      const unit = Math.pow(1024, Math.floor(Math.log(v) / Math.log(1024)));
      return niceMax(v / unit, false) * unit;
    }
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 4, 5, 8, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function lineChart(canvas, series, format, binary) {
    const { ctx, w, h } = setupCanvas(canvas);
    const left = 62, right = 10, top = 18, bottom = 20;
    const pw = w - left - right, ph = h - top - bottom;
    const [t0, t1] = timeRange(state.points);
    let max = 0;
    for (const s of series) for (const p of state.points) {
      const v = p[s.field];
      if (v != null && v > max) max = v;
    }
    const ymax = niceMax(max * 1.05, binary);
    const x = (t) => left + ((t - t0) / (t1 - t0)) * pw;
    const y = (v) => top + ph - (v / ymax) * ph;
    ctx.strokeStyle = "#2a3441"; ctx.fillStyle = "#8b98a9"; ctx.lineWidth = 1;
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    for (let i = 0; i <= 4; i += 1) {
      const v = (ymax * i) / 4, yy = Math.round(y(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(left, yy); ctx.lineTo(left + pw, yy); ctx.stroke();
      ctx.fillText(format(v), left - 6, yy);
    }
    ctx.textAlign = "center"; ctx.textBaseline = "top";
    for (let i = 0; i <= 4; i += 1) {
      const t = t0 + ((t1 - t0) * i) / 4;
      ctx.fillText(clock(t), Math.min(Math.max(x(t), left + 24), left + pw - 24), top + ph + 5);
    }
    let lx = left + 4;
    ctx.textAlign = "left"; ctx.textBaseline = "middle";
    for (const s of series) {
      ctx.strokeStyle = s.color; ctx.lineWidth = 1.8; ctx.beginPath();
      let drawing = false;
      for (const p of state.points) {
        const v = p[s.field];
        if (v == null) { drawing = false; continue; }
        if (drawing) ctx.lineTo(x(p.t), y(v)); else { ctx.moveTo(x(p.t), y(v)); drawing = true; }
      }
      ctx.stroke();
      const last = state.points.length ? state.points[state.points.length - 1][s.field] : null;
      const label = s.label + " " + (last == null ? "–" : format(last));
      ctx.fillStyle = s.color; ctx.fillRect(lx, 5, 9, 9);
      ctx.fillStyle = "#d8dee9"; ctx.fillText(label, lx + 13, 10);
      lx += ctx.measureText(label).width + 30;
    }
  }

  function modeStrip(canvas) {
    const { ctx, w, h } = setupCanvas(canvas);
    const left = 62, right = 10, pw = w - left - right;
    const [t0, t1] = timeRange(state.points);
    const x = (t) => left + ((t - t0) / (t1 - t0)) * pw;
    const pts = state.points;
    for (let i = 0; i < pts.length; i += 1) {
      const a = Math.floor(x(pts[i].t));
      const b = Math.ceil(i + 1 < pts.length ? x(pts[i + 1].t) : left + pw);
      ctx.fillStyle = COLORS[pts[i].mode] || COLORS.unknown;
      ctx.fillRect(a, 4, Math.max(1, b - a), h - 22);
    }
    ctx.fillStyle = "#8b98a9"; ctx.textBaseline = "top"; ctx.textAlign = "left";
    ctx.fillText("mode", 4, 8);
    let lx = left;
    for (const m of ["cdc", "polling"]) {
      ctx.fillStyle = COLORS[m]; ctx.fillRect(lx, h - 14, 9, 9);
      ctx.fillStyle = "#d8dee9"; ctx.fillText(m, lx + 13, h - 15);
      lx += 70;
    }
  }

  function draw() {
    lineChart(document.getElementById("chart-wal"), [
      { field: "slot_lag_bytes", label: "slot lag", color: COLORS.lag },
      { field: "slot_retained_wal_bytes", label: "retained WAL", color: COLORS.retained },
    ], bytes, true);
    lineChart(document.getElementById("chart-throughput"), [
      { field: "throughput_events_per_second", label: "published", color: COLORS.rate },
    ], (v) => rate(v).replace(" /s", ""));
    lineChart(document.getElementById("chart-latency"), [
      { field: "latency_p50_seconds", label: "p50", color: COLORS.p50 },
      { field: "latency_p95_seconds", label: "p95", color: COLORS.p95 },
    ], seconds);
    lineChart(document.getElementById("chart-age"), [
      { field: "oldest_unpublished_age_seconds", label: "age", color: COLORS.age },
    ], seconds);
    modeStrip(document.getElementById("chart-mode"));
  }

  // -- polling -------------------------------------------------------------------------------
  function apply(doc) {
    state.refreshS = Math.max(1, doc.refresh_seconds || 2);
    for (const p of doc.chart || []) {
      if (p.t > state.lastT) { state.points.push(p); state.lastT = p.t; }
    }
    const cutoff = state.lastT - WINDOW_S;
    while (state.points.length && state.points[0].t < cutoff) state.points.shift();
    if (doc.current) { state.current = doc.current; showCurrent(doc.current); }
    draw();
    document.body.dataset.samples = String(state.points.length);
    document.body.dataset.ready = doc.current ? "1" : "0";
  }

  async function tick() {
    const status = document.getElementById("status");
    try {
      const url = "/api/lag" + (state.lastT ? "?since=" + state.lastT : "");
      const response = await fetch(url, { cache: "no-store" });
      if (!response.ok) throw new Error("HTTP " + response.status);
      apply(await response.json());
      status.textContent = "updated " + clock(Date.now() / 1000) + " · every " + state.refreshS + " s";
      status.classList.remove("stale");
    } catch (e) {
      status.textContent = "relay unreachable (" + e.message + ")";
      status.classList.add("stale");
    } finally {
      setTimeout(tick, state.refreshS * 1000);
    }
  }

  window.addEventListener("resize", draw);
  tick();
})();
