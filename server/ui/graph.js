// The dependency graph as SVG: laid out by dagre (a kept library, vendored
// under vendor/ with its licence), drawn here. Creation order runs left to
// right: an arrow goes from the required item to the item that needs it.
// Subgraphs are drawn as clusters, external items dashed, edges whose
// dependency blocks an item red. Colours change in place (no new layout)
// when only states change, so a live update costs one attribute.

import dagre from './vendor/dagre.esm.js';
import { svg } from './dom.js';

const NODE_WIDTH = 180;
const NODE_HEIGHT = 30;
const CHARS = 24;
const LARGE = 300;
// A small graph is drawn at about its natural size, not blown up to fill
// the pane; a large one is scaled down to fit (then zoom in).
const MIN_VIEW_WIDTH = 900;
const MIN_VIEW_HEIGHT = 420;

function shorten(text) {
  return text.length > CHARS ? `${text.slice(0, CHARS - 1)}…` : text;
}

/**
 * Lays out and draws `model` = { nodes: [{ key, type, name, state, external,
 * orphan, subgraph }], edges: [{ from, to, blocked, waits }] } into a new
 * <svg>; `waits` marks an edge that is a wait, not a dependency.
 * Returns { element, setState(key, state), select(key), size }.
 */
export function drawGraph(model, { onSelect } = {}) {
  const graph = new dagre.graphlib.Graph({ compound: true });
  // network-simplex ranks best but grows fast with size; longest-path
  // keeps 1,000 items well under the 2 s budget.
  const ranker = model.nodes.length > LARGE ? 'longest-path' : 'network-simplex';
  graph.setGraph({ rankdir: 'LR', nodesep: 10, ranksep: 48, marginx: 12, marginy: 12, ranker });
  graph.setDefaultEdgeLabel(() => ({}));
  const clusters = new Set();
  for (const node of model.nodes) {
    graph.setNode(node.key, { width: NODE_WIDTH, height: NODE_HEIGHT });
    if (node.subgraph) {
      const parts = node.subgraph.split('/').filter(Boolean);
      let parent = null;
      for (let i = 0; i < parts.length; i++) {
        const path = parts.slice(0, i + 1).join('/');
        const id = `cluster:${path}`;
        if (!clusters.has(id)) {
          clusters.add(id);
          graph.setNode(id, { label: path, paddingTop: 18 });
          if (parent) graph.setParent(id, parent);
        }
        parent = id;
      }
      graph.setParent(node.key, parent);
    }
  }
  for (const edge of model.edges) {
    if (graph.hasNode(edge.from) && graph.hasNode(edge.to)) graph.setEdge(edge.from, edge.to, { blocked: edge.blocked, waits: edge.waits });
  }
  dagre.layout(graph);

  const { width = 0, height = 0 } = graph.graph();
  const root = svg('svg', {
    id: 'graph-svg', class: 'graph', viewBox: `0 0 ${Math.max(width, MIN_VIEW_WIDTH)} ${Math.max(height, MIN_VIEW_HEIGHT)}`,
    role: 'img', 'aria-label': 'dependency graph',
  });
  const defs = svg('defs', {},
    svg('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' },
      svg('path', { d: 'M 0 0 L 10 5 L 0 10 z', class: 'arrow' })),
    svg('marker', { id: 'arrow-blocked', viewBox: '0 0 10 10', refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' },
      svg('path', { d: 'M 0 0 L 10 5 L 0 10 z', class: 'arrow blocked' })));
  const layer = svg('g', { class: 'viewport' });
  root.append(defs, layer);

  const sortedClusters = [...clusters].sort((a, b) => a.split('/').length - b.split('/').length);
  for (const id of sortedClusters) {
    const box = graph.node(id);
    if (!box || box.width === undefined) continue;
    layer.append(svg('g', { class: 'cluster' },
      svg('rect', { x: box.x - box.width / 2, y: box.y - box.height / 2, width: box.width, height: box.height, rx: 6 }),
      svg('text', { x: box.x - box.width / 2 + 8, y: box.y - box.height / 2 + 13 }, id.slice('cluster:'.length))));
  }
  for (const id of graph.edges()) {
    const edge = graph.edge(id);
    const points = edge.points || [];
    if (!points.length) continue;
    const d = points.map((p, i) => `${i ? 'L' : 'M'} ${p.x.toFixed(1)} ${p.y.toFixed(1)}`).join(' ');
    layer.append(svg('path', {
      d, class: `edge${edge.blocked ? ' blocked' : ''}${edge.waits ? ' waits' : ''}`,
      'marker-end': edge.blocked ? 'url(#arrow-blocked)' : 'url(#arrow)',
      'data-from': id.v, 'data-to': id.w,
    }));
  }
  const elements = new Map();
  for (const node of model.nodes) {
    const box = graph.node(node.key);
    const x = box.x - NODE_WIDTH / 2;
    const y = box.y - NODE_HEIGHT / 2;
    const label = `${node.type}/${node.name}`;
    const rect = svg('rect', { x, y, width: NODE_WIDTH, height: NODE_HEIGHT, rx: 4 });
    const group = svg('g', {
      class: nodeClass(node, node.state), 'data-key': node.key, 'data-state': node.state, tabindex: 0,
    },
    svg('title', {}, `${label}\n${node.state}${node.external ? ' (external)' : ''}`),
    rect,
    svg('text', { x: x + 8, y: y + 19 }, shorten(label)),
    node.external ? svg('text', { x: x + NODE_WIDTH - 26, y: y + 12, class: 'ext' }, 'ext') : null);
    group.addEventListener('click', () => onSelect && onSelect(node.key));
    group.addEventListener('keydown', (event) => { if (event.key === 'Enter' && onSelect) onSelect(node.key); });
    elements.set(node.key, { group, node, x: box.x, y: box.y });
    layer.append(group);
  }
  const view = enablePanZoom(root, layer);

  let selected = null;
  return {
    element: root,
    size: model.nodes.length,
    has(key) { return elements.has(key); },
    setState(key, state) {
      const entry = elements.get(key);
      if (!entry) return false;
      entry.node.state = state;
      entry.group.setAttribute('class', nodeClass(entry.node, state) + (selected === key ? ' selected' : ''));
      entry.group.setAttribute('data-state', state);
      return true;
    },
    /** Zooms to natural size (if the graph is scaled down) around `key`. */
    focus(key) {
      const entry = elements.get(key);
      if (entry) view.focus(entry.x, entry.y);
    },
    select(key) {
      if (selected && elements.has(selected)) {
        const previous = elements.get(selected);
        previous.group.setAttribute('class', nodeClass(previous.node, previous.node.state));
      }
      selected = key;
      const entry = elements.get(key);
      if (entry) entry.group.setAttribute('class', `${nodeClass(entry.node, entry.node.state)} selected`);
    },
  };
}

function nodeClass(node, state) {
  return `node state-${state}${node.external ? ' external' : ''}${node.orphan ? ' orphan' : ''}`;
}

// Wheel zooms around the pointer, dragging pans: the layer's transform, in
// viewBox units. Screen points map to viewBox units through the SVG's own
// screen matrix (which includes the centring of preserveAspectRatio).
// Returns { focus(x, y) }.
function enablePanZoom(root, layer) {
  let scale = 1;
  let tx = 0;
  let ty = 0;
  let drag = null;
  const apply = () => layer.setAttribute('transform', `translate(${tx} ${ty}) scale(${scale})`);
  const toView = (clientX, clientY) => {
    const matrix = root.getScreenCTM();
    if (!matrix) return { x: 0, y: 0 };
    return new DOMPoint(clientX, clientY).matrixTransform(matrix.inverse());
  };
  // Screen pixels per viewBox unit.
  const pixels = () => { const matrix = root.getScreenCTM(); return matrix ? matrix.a : 1; };
  root.addEventListener('wheel', (event) => {
    event.preventDefault();
    const at = toView(event.clientX, event.clientY);
    const factor = event.deltaY < 0 ? 1.15 : 1 / 1.15;
    tx = at.x - (at.x - tx) * factor;
    ty = at.y - (at.y - ty) * factor;
    scale *= factor;
    apply();
  }, { passive: false });
  root.addEventListener('pointerdown', (event) => {
    if (event.target.closest && event.target.closest('.node')) return;
    drag = { x: event.clientX, y: event.clientY, tx, ty };
    root.setPointerCapture(event.pointerId);
  });
  root.addEventListener('pointermove', (event) => {
    if (!drag) return;
    const perPixel = 1 / pixels();
    tx = drag.tx + (event.clientX - drag.x) * perPixel;
    ty = drag.ty + (event.clientY - drag.y) * perPixel;
    apply();
  });
  root.addEventListener('pointerup', () => { drag = null; });
  return {
    focus(x, y) {
      // Only a graph drawn smaller than its natural size needs it.
      const perPixel = 1 / pixels();
      if (perPixel <= 1) return;
      scale = perPixel;
      const box = root.getBoundingClientRect();
      const center = toView(box.left + box.width / 2, box.top + box.height / 2);
      tx = center.x - x * scale;
      ty = center.y - y * scale;
      apply();
    },
  };
}
