// viz.js — the step timeline and the block map, drawn from a laid-out trace
// (src/trace/report.rs `layout`): used by `wllm trace` reports and by the live
// /engine page. Plain DOM and canvas; no libraries, no network.
"use strict";

const WLLM_STATE = {
  w: { name: "waiting", color: "#d5d8dc" },
  p: { name: "prefill", color: "#e67e22" },
  d: { name: "decode", color: "#2e86c1" },
  x: { name: "preempted", color: "#c0392b" },
};

// A stable, distinct colour per request id.
function wllmOwnerColor(id) {
  const hue = (id * 137.508) % 360;
  return `hsl(${hue.toFixed(1)}, 62%, ${45 + (id % 3) * 8}%)`;
}

// The block map after `step`: the pool before the first step with every
// step's changes up to `step` applied ([block, owner, refs, cached] each).
function wllmMapAt(data, step) {
  const b = data.base_map;
  const m = { owners: b.owners.slice(), refs: b.refs.slice(), cached: b.cached.slice() };
  for (const c of data.map_changes) {
    if (c.step > step) break;
    for (const [blk, owner, refs, cached] of c.changes) {
      if (blk < m.owners.length) { m.owners[blk] = owner; m.refs[blk] = refs; m.cached[blk] = cached; }
    }
  }
  return m;
}

// Fills `el` with one cell per pool block: coloured by owner, the reference
// count written on blocks shared through the prefix cache, cached-free blocks
// hatched grey, clean free blocks white.
function wllmDrawBlockMap(el, map) {
  el.textContent = "";
  el.classList.add("wllm-blockmap");
  const frag = document.createDocumentFragment();
  for (let i = 0; i < map.owners.length; i++) {
    const c = document.createElement("div");
    const owner = map.owners[i], refs = map.refs[i], cached = map.cached[i];
    c.className = "blk";
    if (refs > 0) {
      c.classList.add("used");
      c.style.background = wllmOwnerColor(owner);
      c.title = `block ${i}: request ${owner}` + (refs > 1 ? `, shared by ${refs} sequences` : "") +
        (cached ? ", in the prefix cache" : "");
      if (refs > 1) {
        c.classList.add("shared");
        c.textContent = refs;
      }
    } else if (cached) {
      c.classList.add("cached");
      c.title = `block ${i}: free, still in the prefix cache`;
    } else {
      c.classList.add("free");
      c.title = `block ${i}: free`;
    }
    frag.appendChild(c);
  }
  el.appendChild(frag);
}

// Draws requests × steps on `canvas`; `selected` (a step index) is outlined.
// Returns the pixel geometry for picking.
function wllmDrawTimeline(canvas, data, selected) {
  const n = data.steps.length, rows = data.requests.length;
  const cw = Math.max(2, Math.min(14, Math.floor(1600 / Math.max(1, n))));
  const rh = Math.max(3, Math.min(14, Math.floor(480 / Math.max(1, rows))));
  const left = 90;
  canvas.width = left + n * cw + 2;
  canvas.height = rows * rh + 2;
  const g = canvas.getContext("2d");
  g.fillStyle = "#fff";
  g.fillRect(0, 0, canvas.width, canvas.height);
  g.font = `${Math.min(11, rh)}px sans-serif`;
  g.textBaseline = "middle";
  data.requests.forEach((r, y) => {
    if (rh >= 8) {
      g.fillStyle = "#333";
      g.fillText(`req ${r.id}`, 2, y * rh + rh / 2);
    }
    for (let x = 0; x < r.cells.length; x++) {
      const s = WLLM_STATE[r.cells[x]];
      if (!s) continue;
      g.fillStyle = s.color;
      g.fillRect(left + x * cw, y * rh, Math.max(1, cw - (cw > 3 ? 1 : 0)), Math.max(1, rh - 1));
    }
  });
  if (selected !== null && selected !== undefined) {
    const x = selected - data.first_step;
    g.strokeStyle = "#000";
    g.lineWidth = 2;
    g.strokeRect(left + x * cw, 0, cw, canvas.height);
  }
  return { left: left, cw: cw, rh: rh };
}

// The step index under a click on the timeline, or null.
function wllmPickStep(ev, canvas, geom, data) {
  const r = canvas.getBoundingClientRect();
  const x = (ev.clientX - r.left) * (canvas.width / r.width) - geom.left;
  const i = Math.floor(x / geom.cw);
  return i >= 0 && i < data.steps.length ? data.first_step + i : null;
}

// The legend of timeline states, as HTML.
function wllmLegend() {
  return Object.values(WLLM_STATE)
    .map((s) => `<span class="key"><i style="background:${s.color}"></i>${s.name}</span>`)
    .join(" ");
}
