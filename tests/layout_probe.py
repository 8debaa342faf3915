"""Layout defects of a page as drawn in the browser: overlapping or clipped text and colour
bars taller than their images, in every plotly chart and in the instant attention view.

:func:`layout_defects` returns one readable line per defect (empty when the page holds).
The rules, all in CSS pixels of the page:

* **text boxes** are the bounding boxes of the visible ``<text>`` elements of a chart's SVG
  (titles, axis titles, tick labels, colour-bar titles and ticks, annotations, legend
  entries); hover labels are not counted, nor elements plotly hid itself (``display: none``,
  ``visibility: hidden``, opacity 0, an empty string). Two boxes **overlap** when their
  intersection is more than :data:`OVERLAP_PX` wide and high. A box is **clipped** when it
  reaches more than :data:`CLIP_PX` beyond its chart (the plotly SVG, and the Streamlit
  element that holds it).
* a **colour bar** (its coloured fill) is **too tall** when it reaches more than
  :data:`BAR_PX` above or below the images to its left whose height it overlaps (heatmaps,
  image traces, layout images; each cut to its subplot's plot area). A colour bar with no image beside it (a scatter plot's) is not compared.
* in the **instant view's iframe**, the text boxes are the client rectangles of every
  visible text node; the same overlap and clip rules apply (clipped by the iframe's
  viewport or a scrolling/hidden-overflow ancestor), and an arrow button (◀ ▶ ▼ ▲) must sit
  on the same line as the value it steps.
"""

from __future__ import annotations

OVERLAP_PX = 1.5
CLIP_PX = 1.0
BAR_PX = 3.0

_PLOTLY_JS = r"""
([OVERLAP, CLIP, BAR]) => {
  const out = [];
  const visible = el => el.checkVisibility({opacityProperty: true, visibilityProperty: true});
  const box = r => ({l: r.left, t: r.top, r: r.right, b: r.bottom});
  const inter = (a, b) => ({w: Math.min(a.r, b.r) - Math.max(a.l, b.l), h: Math.min(a.b, b.b) - Math.max(a.t, b.t)});
  const label = s => JSON.stringify(s.length > 70 ? s.slice(0, 67) + '...' : s);
  const charts = [...document.querySelectorAll('.js-plotly-plot')];
  charts.forEach((plot, index) => {
    const svg = plot.querySelector('.main-svg');
    if (!svg || !visible(plot)) return;
    const own = (plot.layout || {}).title;
    const titleText = typeof own === 'string' ? own : (own && own.text) || '';
    const name = `chart ${index + 1}` + (titleText ? ` (${label(titleText)})` : '');
    let bounds = box(svg.getBoundingClientRect());
    const holder = plot.closest('[data-testid="stPlotlyChart"]') || plot.closest('[data-testid="stElementContainer"]');
    if (holder) {
      const h = box(holder.getBoundingClientRect());
      bounds = {l: Math.max(bounds.l, h.l), t: Math.max(bounds.t, h.t), r: Math.min(bounds.r, h.r), b: Math.min(bounds.b, h.b)};
    }
    const texts = [];
    for (const el of plot.querySelectorAll('svg text')) {
      if (el.closest('.hoverlayer') || !visible(el)) continue;
      const lines = el.querySelectorAll('tspan.line');  // a wrapped label: its lines, space-separated
      const text = (lines.length ? [...lines].map(t => t.textContent).join(' ') : el.textContent || '').trim();
      if (!text) continue;
      const r = el.getBoundingClientRect();
      if (r.width < 0.5 || r.height < 0.5) continue;
      const kind = el.closest('.colorbar') ? 'colour bar' : el.closest('.infolayer .annotation') ? 'annotation' :
                   el.classList.contains('gtitle') ? 'title' : el.closest('.xtick, .ytick, [class*="tick"]') ? 'tick label' :
                   el.closest('.legend') ? 'legend' : /title/.test(el.getAttribute('class') || '') ? 'axis title' : 'text';
      texts.push({text, kind, ...box(r)});
    }
    for (const t of texts) {
      const over = Math.max(bounds.l - t.l, t.r - bounds.r, bounds.t - t.t, t.b - bounds.b);
      if (over > CLIP) out.push(`${name}: ${t.kind} ${label(t.text)} is clipped by ${over.toFixed(0)} px`);
    }
    for (let i = 0; i < texts.length; i++) for (let j = i + 1; j < texts.length; j++) {
      const o = inter(texts[i], texts[j]);
      if (o.w > OVERLAP && o.h > OVERLAP)
        out.push(`${name}: ${texts[i].kind} ${label(texts[i].text)} overlaps ${texts[j].kind} ${label(texts[j].text)}` +
                 ` (${o.w.toFixed(0)}×${o.h.toFixed(0)} px)`);
    }
    // colour bars against the images beside them
    const areas = [...plot.querySelectorAll('.draglayer .nsewdrag')].map(a => box(a.getBoundingClientRect()));
    const images = [];
    for (const img of plot.querySelectorAll('.cartesianlayer image, .layer-below image, .layer-above image')) {
      if (!visible(img)) continue;
      const r = box(img.getBoundingClientRect());
      let best = null, bestArea = 0;
      for (const a of areas) {
        const o = inter(r, a);
        if (o.w > 0 && o.h > 0 && o.w * o.h > bestArea) { best = a; bestArea = o.w * o.h; }
      }
      if (!best) continue;
      images.push({l: Math.max(r.l, best.l), t: Math.max(r.t, best.t), r: Math.min(r.r, best.r), b: Math.min(r.b, best.b)});
    }
    for (const bar of plot.querySelectorAll('.colorbar')) {
      const fills = [...bar.querySelectorAll('.cbfills rect, rect.cbfill, .cbfill')].filter(visible);
      if (!fills.length) continue;
      const rs = fills.map(f => box(f.getBoundingClientRect()));
      const fb = {l: Math.min(...rs.map(r => r.l)), t: Math.min(...rs.map(r => r.t)), r: Math.max(...rs.map(r => r.r)),
                  b: Math.max(...rs.map(r => r.b))};
      const left = images.filter(im => im.r <= fb.l + 1 && im.b > fb.t && im.t < fb.b);
      if (!left.length) continue;
      const top = Math.min(...left.map(im => im.t)), bottom = Math.max(...left.map(im => im.b));
      const above = top - fb.t, below = fb.b - bottom;
      if (above > BAR || below > BAR) {
        const titleEl = bar.querySelector('.cbtitle text');
        const title = titleEl ? label(titleEl.textContent.trim()) : '(untitled)';
        out.push(`${name}: colour bar ${title} is ${(fb.b - fb.t).toFixed(0)} px tall beside an image of ` +
                 `${(bottom - top).toFixed(0)} px (${Math.max(above, 0).toFixed(0)} px above, ${Math.max(below, 0).toFixed(0)} px below)`);
      }
    }
  });
  return out;
}
"""

_VIEW_JS = r"""
([OVERLAP, CLIP]) => {
  const out = [];
  const visible = el => el.checkVisibility({opacityProperty: true, visibilityProperty: true});
  const label = s => JSON.stringify(s.length > 70 ? s.slice(0, 67) + '...' : s);
  const texts = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const viewport = {l: 0, t: 0, r: document.documentElement.clientWidth, b: document.documentElement.clientHeight};
  while (walker.nextNode()) {
    const node = walker.currentNode;
    const text = node.textContent.trim();
    const el = node.parentElement;
    if (!text || !el || !visible(el) || el.closest('script, style')) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    const r = range.getBoundingClientRect();
    if (r.width < 0.5 || r.height < 0.5) continue;
    let bounds = {...viewport};
    for (let a = el; a && a !== document.body; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.overflowX !== 'visible' || s.overflowY !== 'visible') {
        const c = a.getBoundingClientRect();
        bounds = {l: Math.max(bounds.l, c.left), t: Math.max(bounds.t, c.top), r: Math.min(bounds.r, c.right), b: Math.min(bounds.b, c.bottom)};
      }
    }
    texts.push({text, el, l: r.left, t: r.top, r: r.right, b: r.bottom, bounds});
  }
  for (const t of texts) {
    const over = Math.max(t.bounds.l - t.l, t.r - t.bounds.r, t.bounds.t - t.t, t.b - t.bounds.b);
    if (over > CLIP) out.push(`instant view: ${label(t.text)} is clipped by ${over.toFixed(0)} px`);
  }
  for (let i = 0; i < texts.length; i++) for (let j = i + 1; j < texts.length; j++) {
    const a = texts[i], b = texts[j];
    const w = Math.min(a.r, b.r) - Math.max(a.l, b.l), h = Math.min(a.b, b.b) - Math.max(a.t, b.t);
    if (w > OVERLAP && h > OVERLAP) out.push(`instant view: ${label(a.text)} overlaps ${label(b.text)} (${w.toFixed(0)}×${h.toFixed(0)} px)`);
  }
  for (const button of document.querySelectorAll('button')) {
    if (!visible(button) || !/^[◀▶▼▲]$/.test(button.textContent.trim())) continue;
    const value = button.textContent.trim() === '▶' || button.textContent.trim() === '▲'
      ? button.previousElementSibling : button.nextElementSibling;
    if (!value || !visible(value)) continue;
    const a = button.getBoundingClientRect(), b = value.getBoundingClientRect();
    if (Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) < Math.min(a.height, b.height) / 2)
      out.push(`instant view: the ${button.textContent.trim()} button wrapped off the line of ${label(value.textContent.trim())}`);
  }
  return out;
}
"""


def plotly_defects(frame) -> list[str]:
    """Defects of every plotly chart in ``frame`` (a Playwright page or frame)."""
    return frame.evaluate(_PLOTLY_JS, [OVERLAP_PX, CLIP_PX, BAR_PX])


def view_defects(frame) -> list[str]:
    """Defects of the instant view drawn in ``frame`` (its iframe's Frame)."""
    return frame.evaluate(_VIEW_JS, [OVERLAP_PX, CLIP_PX])


def layout_defects(page) -> list[str]:
    """Every layout defect of a Streamlit page: its plotly charts, then each instant view."""
    defects = plotly_defects(page)
    for frame in page.frames:
        if "attention_view" in frame.url:
            defects += view_defects(frame)
    return defects
