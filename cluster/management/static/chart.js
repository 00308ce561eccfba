// quorumq management UI: a small line chart drawn on a canvas (no library, no build step).
"use strict";

const CHART_COLORS = ["#2e5aac", "#12b76a", "#dc6803", "#9e77ed", "#d92d20", "#0e9384"];

// draw series [{name, label, values}] against times t (ms) into canvas; nulls are gaps
function drawChart(canvas, t, series, unit) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, width, height);
  const left = 56, right = 8, top = 8, bottom = 20;
  let max = 0;
  for (const s of series) for (const v of s.values) if (v !== null && v > max) max = v;
  max = niceMax(max);
  g.strokeStyle = "#d0d5dd";
  g.fillStyle = "#667085";
  g.font = "11px system-ui, sans-serif";
  for (let i = 0; i <= 4; i++) {
    const y = top + (height - top - bottom) * i / 4;
    g.beginPath(); g.moveTo(left, y); g.lineTo(width - right, y); g.stroke();
    g.fillText(formatNumber(max * (4 - i) / 4) + (unit || ""), 2, y + 4);
  }
  if (t.length === 0) { g.fillText("no samples yet", left + 10, height / 2); return; }
  const t0 = t[0], t1 = Math.max(t[t.length - 1], t0 + 1);
  const x = (ms) => left + (width - left - right) * (ms - t0) / (t1 - t0);
  const y = (v) => top + (height - top - bottom) * (1 - v / max);
  g.fillText(new Date(t0).toLocaleTimeString(), left, height - 4);
  const end = new Date(t1).toLocaleTimeString();
  g.fillText(end, width - right - g.measureText(end).width, height - 4);
  series.forEach((s, k) => {
    g.strokeStyle = CHART_COLORS[k % CHART_COLORS.length];
    g.lineWidth = 1.6;
    g.beginPath();
    let drawing = false;
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) { drawing = false; return; }
      if (drawing) g.lineTo(x(t[i]), y(v)); else g.moveTo(x(t[i]), y(v));
      drawing = true;
    });
    g.stroke();
    g.fillStyle = g.strokeStyle;
    s.values.forEach((v, i) => {  // a point with no neighbour draws no line: a dot shows it
      const alone = (i === 0 || s.values[i - 1] == null) && s.values[i + 1] == null;
      if (v !== null && v !== undefined && alone) {
        g.beginPath(); g.arc(x(t[i]), y(v), 3, 0, 2 * Math.PI); g.fill();
      }
    });
  });
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function formatNumber(v) {
  if (v === null || v === undefined) return "–";
  if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(1) + "k";
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}
