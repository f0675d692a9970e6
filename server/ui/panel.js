// The item panel: intended / applied / observed values side by side (one
// row per JSON Pointer, differences marked), the operation in flight, why
// the item waits and on what, the last error, and what it needs.

import { ago, h, iso } from './dom.js';
import { errorText, flatten, kindOf, label, short } from './items.js';

/** The values table of an item. */
function valuesTable(intent, status) {
  const columns = [
    ['intended', intent ? intent.item.properties : undefined],
    ['applied', status && status.applied ? status.applied.properties : undefined],
    ['observed', status ? status.observed : undefined],
  ];
  const flat = columns.map(([, value]) => (value === undefined ? null : flatten(value)));
  const paths = new Set();
  for (const map of flat) if (map) for (const path of map.keys()) paths.add(path);
  if (!paths.size) return h('p', { class: 'muted' }, 'No properties.');
  const rows = [...paths].sort().map((path) => {
    const values = flat.map((map) => (map ? map.get(path) : undefined));
    const [want, applied, observed] = values;
    // Intended and applied differ wherever either has a path the other
    // lacks or a different value (a property removed from the intent and
    // still applied is a change too); observed only where it reports a
    // path the applied value has.
    const differs = (flat[0] && flat[1] && want !== applied)
      || (observed !== undefined && applied !== undefined && observed !== applied);
    return h('tr', { class: differs ? 'diff' : '' }, h('td', { class: 'path' }, path),
      values.map((value, i) => h('td', { class: flat[i] ? '' : 'muted' },
        flat[i] ? (value === undefined ? '—' : value) : 'n/a')));
  });
  return h('table', { class: 'values' },
    h('thead', {}, h('tr', {}, h('th', {}, 'property'), columns.map(([name]) => h('th', {}, name)))),
    h('tbody', {}, rows));
}

/**
 * The panel of one item: `ref`, its IntendedItem `intent` and ItemStatus
 * `item` (either may be missing), the `state` shown, and `link(ref)` giving
 * the in-page link of another item. Returns the panel's nodes.
 */
export function itemPanel({ ref, intent, item, state, link }) {
  const itemValue = intent ? intent.item : item && item.applied;
  const op = item && item.operation;
  const sections = [
    h('h3', { id: 'item-title' }, label(ref), ' ', h('span', { class: `badge item-state state-item-${state}` }, state),
      (itemValue && itemValue.external) || (item && item.external) ? h('span', { class: 'chip' }, 'external') : ''),
    itemValue && (itemValue.label || itemValue.description)
      ? h('p', { class: 'muted' }, [itemValue.label, itemValue.description].filter(Boolean).join(' — ')) : '',
    h('dl', {},
      h('dt', {}, 'subgraph'), h('dd', {}, (itemValue && itemValue.subgraph) || '(root)'),
      h('dt', {}, 'generation'), h('dd', {},
        `intended ${intent ? intent.generation : '—'} · applied ${item ? item.applied_generation : '—'}`),
      !intent ? [h('dt', {}, 'intent'), h('dd', {}, 'not intended: will be deleted')] : ''),
    item && item.partial ? h('p', { id: 'item-partial', class: 'muted' },
      'This item\'s status is over 48 KiB, too large for the live stream: its state and error are current, '
      + 'its values and the rest as last received. Reload the page to see them in full.') : '',
    h('h4', {}, 'Values'),
    valuesTable(intent, item),
  ];
  if (op) {
    sections.push(h('h4', {}, 'Operation in flight'), h('dl', { id: 'item-operation' },
      h('dt', {}, 'operation'), h('dd', {}, `${kindOf(op.kind)} · attempt ${op.attempt} · to generation ${op.target_generation}`),
      h('dt', {}, 'started'), h('dd', { title: iso(op.started_at) }, ago(op.started_at)),
      h('dt', {}, 'timeout'), h('dd', {}, op.timeout !== undefined ? `${op.timeout} s` : '—'),
      h('dt', {}, 'progress'), h('dd', {}, op.last_progress_at
        ? `${op.progress_message || 'reported'} (${ago(op.last_progress_at)})` : 'none reported'),
      h('dt', {}, 'op id'), h('dd', { class: 'mono' }, op.op_id)));
  }
  if (item && item.pending_operation !== 'OPERATION_KIND_UNSPECIFIED') {
    sections.push(h('h4', {}, 'Waiting'), h('div', { id: 'item-waiting' },
      h('p', {}, `${kindOf(item.pending_operation)} waits: ${short(item.reason, 'WAIT_REASON_').toLowerCase().replace(/_/g, ' ')}`),
      item.blocked_by.length ? h('ul', {}, item.blocked_by.map((blocker) => h('li', {},
        h('a', { href: link(blocker.item) }, label(blocker.item)), ` — ${blocker.why}`))) : ''));
  }
  if (item && (item.last_error || item.attempts)) {
    sections.push(h('h4', {}, 'Last error'), h('dl', { id: 'item-error' },
      h('dt', {}, 'error'), h('dd', { class: 'error-text' }, item.last_error ? errorText(item.last_error) : 'none'),
      h('dt', {}, 'operation'), h('dd', {}, kindOf(item.last_operation)),
      h('dt', {}, 'attempts'), h('dd', {}, String(item.attempts)),
      item.next_attempt_at ? [h('dt', {}, 'next attempt'), h('dd', { title: iso(item.next_attempt_at) }, item.next_attempt_at.toLocaleTimeString())] : ''));
  }
  if (itemValue && itemValue.dependencies.length) {
    sections.push(h('h4', {}, 'Needs'), h('ul', {}, itemValue.dependencies.map((dependency) => h('li', {},
      h('a', { href: link(dependency.requires) }, label(dependency.requires)),
      dependency.must_satisfy ? h('code', {}, ` ${dependency.must_satisfy}`) : ''))));
  }
  return sections;
}
