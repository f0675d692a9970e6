// The fleet view: every tenant the token may see, its Ready / Reconciling /
// Stalled condition, generations, items by state and connected agents.
//
// Live without polling: an admin token follows Tenants.WatchFleet
// (conditions, as they change, in fleet revision order) and refreshes a
// tenant's counts with one GetTenant after each of its changes; a tenant
// token follows its own tenant's Watch the same way. The list is
// virtualized (only the rows in view exist in the DOM), so 10,000 tenants
// scroll and filter as smoothly as ten.

import * as api from './api.js';
import { ago, h, iso, replace } from './dom.js';

const ROW_HEIGHT = 34;
const OVERSCAN = 8;
const REFRESH_CONCURRENCY = 4;

/** The overall state of a tenant from its conditions. */
export function summarize(conditions) {
  const byType = {};
  for (const condition of conditions || []) byType[condition.type] = condition;
  const holds = (type) => byType[type] && byType[type].status === 'CONDITION_STATUS_TRUE';
  if (holds('Stalled')) return { state: 'Stalled', condition: byType.Stalled };
  if (holds('Reconciling')) return { state: 'Reconciling', condition: byType.Reconciling };
  if (holds('Ready')) return { state: 'Ready', condition: byType.Ready };
  if (byType.Ready) return { state: 'NotReady', condition: byType.Ready };
  return { state: 'Unknown', condition: null };
}

const STATE_RANK = { Stalled: 0, NotReady: 1, Reconciling: 2, Unknown: 3, Ready: 4 };
const STATE_LABEL = {
  Stalled: 'Stalled', NotReady: 'Not ready', Reconciling: 'Reconciling', Unknown: 'Unknown', Ready: 'Ready',
};

/** A badge for a state ("Ready", "Stalled", ...). */
export function stateBadge(state) {
  return h('span', { class: `badge state-${state}` }, STATE_LABEL[state] || state);
}

/** "CREATED 3 · FAILED 1" chips of a TenantStatus.items_by_state map. */
export function itemChips(itemsByState) {
  const entries = Object.entries(itemsByState || {}).filter(([, count]) => Number(count) > 0);
  if (!entries.length) return h('span', { class: 'muted' }, 'no items');
  return entries.sort().map(([state, count]) => h('span', { class: `chip item-${state}`, title: state },
    `${state.toLowerCase()} ${count}`));
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    if (signal) signal.addEventListener('abort', () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

/**
 * Mounts the fleet view into `root`. `report(error)` shows a failed call's
 * message; `clear()` hides it. Returns { dispose }.
 */
export function mountFleet(root, { report, clear }) {
  const abort = new AbortController();
  const tenants = new Map();
  const filters = { text: '', state: 'all', sort: 'stalled' };
  let view = [];
  let dirtyView = true;
  let frame = 0;

  const filterInput = h('input', {
    id: 'fleet-filter', type: 'search', placeholder: 'Filter by name', autocomplete: 'off',
  });
  const stateSelect = h('select', { id: 'fleet-state', 'aria-label': 'Show' },
    h('option', { value: 'all' }, 'All states'),
    h('option', { value: 'Stalled' }, 'Stalled'),
    h('option', { value: 'Reconciling' }, 'Reconciling'),
    h('option', { value: 'NotReady' }, 'Not ready'),
    h('option', { value: 'Ready' }, 'Ready'));
  const sortSelect = h('select', { id: 'fleet-sort', 'aria-label': 'Sort' },
    h('option', { value: 'stalled' }, 'Stalled first'),
    h('option', { value: 'name' }, 'By name'));
  const summary = h('span', { id: 'fleet-summary', class: 'summary' }, 'Loading…');
  const live = h('span', { id: 'fleet-live', class: 'live off', title: 'Live updates' }, 'connecting');
  const rows = h('div', { id: 'fleet-rows', class: 'rows' });
  const spacer = h('div', { class: 'spacer' });
  const viewport = h('div', { id: 'fleet-scroll', class: 'scroll' }, spacer, rows);
  const header = h('div', { class: 'row head' },
    h('span', { class: 'c-name' }, 'Tenant'), h('span', { class: 'c-state' }, 'Status'),
    h('span', { class: 'c-reason' }, 'Reason · message'), h('span', { class: 'c-since' }, 'Since'),
    h('span', { class: 'c-gen' }, 'Generation'), h('span', { class: 'c-items' }, 'Items'),
    h('span', { class: 'c-agents' }, 'Agents'));
  replace(root, h('section', { id: 'fleet', class: 'fleet' },
    h('div', { class: 'toolbar' }, h('h2', {}, 'Fleet'), filterInput, stateSelect, sortSelect, summary, live),
    header, viewport));

  filterInput.addEventListener('input', () => { filters.text = filterInput.value.toLowerCase(); changed(); });
  stateSelect.addEventListener('change', () => { filters.state = stateSelect.value; changed(); });
  sortSelect.addEventListener('change', () => { filters.sort = sortSelect.value; changed(); });
  viewport.addEventListener('scroll', () => schedule());
  window.addEventListener('resize', schedule);

  function tenant(name) {
    let entry = tenants.get(name);
    if (!entry) {
      entry = { name, conditions: [], fromFleet: false, status: null, version: 0 };
      tenants.set(name, entry);
    }
    return entry;
  }

  function changed(entry) {
    if (entry) entry.version += 1;
    dirtyView = true;
    schedule();
  }

  function schedule() {
    if (!frame) frame = requestAnimationFrame(render);
  }

  function rebuildView() {
    const text = filters.text;
    view = [];
    const counts = { Stalled: 0, Reconciling: 0, Ready: 0, NotReady: 0, Unknown: 0 };
    for (const entry of tenants.values()) {
      entry.summary = summarize(entry.conditions);
      counts[entry.summary.state] += 1;
      if (text && !entry.name.toLowerCase().includes(text)) continue;
      if (filters.state !== 'all' && entry.summary.state !== filters.state) continue;
      view.push(entry);
    }
    const byName = (a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
    if (filters.sort === 'stalled') {
      view.sort((a, b) => STATE_RANK[a.summary.state] - STATE_RANK[b.summary.state] || byName(a, b));
    } else {
      view.sort(byName);
    }
    summary.textContent = `${tenants.size} tenants · ${counts.Stalled} stalled · ${counts.Reconciling} reconciling`
      + ` · ${counts.NotReady} not ready · ${counts.Ready} ready` + (view.length !== tenants.size ? ` · ${view.length} shown` : '');
    spacer.style.height = `${view.length * ROW_HEIGHT}px`;
    dirtyView = false;
  }

  // Rows are rebuilt only when their tenant changed (or every few seconds,
  // for the ages): a row under the pointer stays the same element.
  const rowCache = new Map();
  let ageTick = 0;
  function row(entry) {
    const cached = rowCache.get(entry.name);
    if (cached && cached.version === entry.version && cached.tick === ageTick) return cached.element;
    const element = buildRow(entry);
    rowCache.set(entry.name, { version: entry.version, tick: ageTick, element });
    return element;
  }

  function buildRow(entry) {
    const { state, condition } = entry.summary;
    const status = entry.status;
    const generation = status ? `${status.observed_generation} / ${status.generation}` : '';
    const behind = status && status.observed_generation !== status.generation;
    const types = status ? status.connected_item_types : [];
    const since = condition ? condition.last_transition_time : null;
    if (entry.quarantine) {
      return h('div', { class: 'row state-Stalled', 'data-tenant': entry.name },
        h('span', { class: 'c-name', title: entry.name }, entry.name),
        h('span', { class: 'c-state' }, stateBadge('Quarantined')),
        h('span', { class: 'c-reason', title: entry.quarantine },
          h('b', {}, 'Quarantined'), ` ${entry.quarantine}`));
    }
    return h('div', { class: `row state-${state}`, 'data-tenant': entry.name },
      h('a', { class: 'c-name', href: `#/tenant/${encodeURIComponent(entry.name)}`, title: entry.name }, entry.name),
      h('span', { class: 'c-state' }, stateBadge(state)),
      h('span', { class: 'c-reason', title: condition ? condition.message : '' },
        condition ? h('b', {}, condition.reason) : '', condition && condition.message ? ` ${condition.message}` : ''),
      h('span', { class: 'c-since', title: iso(since) }, ago(since)),
      h('span', { class: `c-gen${behind ? ' behind' : ''}`, title: 'observed / intended generation' }, generation),
      h('span', { class: 'c-items' }, status ? itemChips(status.items_by_state) : ''),
      h('span', { class: 'c-agents', title: types.join(', ') },
        status ? (types.length ? `${types.length} type${types.length === 1 ? '' : 's'}: ${types.join(', ')}` : 'none') : ''));
  }

  function render() {
    frame = 0;
    if (dirtyView) rebuildView();
    const top = viewport.scrollTop;
    const height = viewport.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / ROW_HEIGHT) - OVERSCAN);
    const last = Math.min(view.length, Math.ceil((top + height) / ROW_HEIGHT) + OVERSCAN);
    rows.style.transform = `translateY(${first * ROW_HEIGHT}px)`;
    const visible = [];
    for (let i = first; i < last; i++) visible.push(row(view[i]));
    if (!view.length) visible.push(h('div', { class: 'empty' }, tenants.size ? 'No tenant matches.' : 'No tenants yet.'));
    rows.replaceChildren(...visible);
    if (rowCache.size > 4 * (last - first) + 200) {
      const keep = new Set(visible);
      for (const [name, cached] of rowCache) if (!keep.has(cached.element)) rowCache.delete(name);
    }
  }

  // Counts (items by state, generations, agents) come from GetTenant /
  // GetStatus, fetched again after each change, a few at a time.
  const refreshQueue = new Set();
  let refreshing = 0;
  function refresh(name) {
    refreshQueue.add(name);
    pump();
  }
  function pump() {
    while (refreshing < REFRESH_CONCURRENCY && refreshQueue.size) {
      const name = refreshQueue.values().next().value;
      refreshQueue.delete(name);
      refreshing += 1;
      fetchStatus(name)
        .then((status) => {
          if (!tenants.has(name)) return;
          const entry = tenant(name);
          entry.status = status;
          if (!entry.fromFleet) entry.conditions = status.conditions;
          changed(entry);
        })
        .catch((error) => { if (!abort.signal.aborted) report(error); })
        .finally(() => { refreshing -= 1; pump(); });
    }
  }

  const scopedTenant = api.session.tenant;
  async function fetchStatus(name) {
    if (scopedTenant) return api.getStatus(name, abort.signal);
    const found = await api.getTenant(name, abort.signal);
    return found.status;
  }

  function setLive(on, text) {
    live.className = `live ${on ? 'on' : 'off'}`;
    live.textContent = text;
  }

  async function followFleet() {
    let revision = 0;
    let listed = false;
    let relist = false;
    let backoff = 500;
    while (!abort.signal.aborted) {
      // From revision 0 the stream starts with a snapshot of every tenant;
      // one listed before but not in it was deleted while the stream was
      // away (its `deleted` event compacted out of the history).
      let snapshot = revision === 0 ? new Set() : null;
      let opened = false;
      try {
        for await (const message of api.watchFleet(revision, abort.signal)) {
          backoff = 500;
          if (!opened) {
            opened = true;
            // Back after a break, perhaps across a restart: what is no
            // event (a tenant quarantined or restored at start-up, counts)
            // is listed again.
            if (relist && listed) {
              relist = false;
              listAll();
            }
            // A resumed stream is live from its first message (one that
            // starts with a snapshot is once it is Synced).
            if (!snapshot) {
              setLive(true, 'live');
              clear();
            }
          }
          if (message.events) {
            for (const event of message.events.events) {
              if (snapshot && !event.deleted) snapshot.add(event.tenant);
              if (event.deleted) { tenants.delete(event.tenant); refreshQueue.delete(event.tenant); rowCache.delete(event.tenant); continue; }
              const entry = tenant(event.tenant);
              entry.conditions = event.conditions;
              entry.quarantine = event.quarantine_error || '';
              entry.fromFleet = true;
              entry.version += 1;
              if (listed) refresh(event.tenant);
            }
            if (!message.events.continued) revision = message.events.revision;
            changed();
          } else if (message.synced) {
            revision = message.synced.revision;
            if (snapshot) {
              for (const name of [...tenants.keys()]) {
                if (!snapshot.has(name)) { tenants.delete(name); refreshQueue.delete(name); rowCache.delete(name); }
              }
              snapshot = null;
              changed();
            }
            setLive(true, 'live');
            clear();
            if (!listed) { listed = true; listAll(); }
          } else if (message.bookmark) {
            revision = message.bookmark.revision;
          }
        }
      } catch (error) {
        if (abort.signal.aborted) return;
        report(error);
        if (error.codeName === 'OUT_OF_RANGE') revision = 0;
        if (error.codeName === 'UNAUTHENTICATED' || error.codeName === 'PERMISSION_DENIED') {
          setLive(false, 'denied');
          return;
        }
      }
      setLive(false, 'reconnecting');
      relist = true;
      await sleep(backoff, abort.signal);
      backoff = Math.min(backoff * 2, 10000);
    }
  }

  async function listAll() {
    let pageToken = '';
    try {
      do {
        const page = await api.listTenants(pageToken, 1000, abort.signal);
        for (const found of page.tenants) {
          const entry = tenant(found.name);
          entry.status = found.status;
          // Not served: its records could not be read at start-up.
          entry.quarantine = found.quarantine_error || '';
          if (!entry.fromFleet) entry.conditions = found.status ? found.status.conditions : [];
          entry.version += 1;
        }
        pageToken = page.next_page_token;
        changed();
      } while (pageToken);
    } catch (error) {
      if (!abort.signal.aborted) report(error);
    }
  }

  async function followTenant(name) {
    let backoff = 500;
    while (!abort.signal.aborted) {
      try {
        const status = await api.getStatus(name, abort.signal);
        const entry = tenant(name);
        entry.status = status;
        entry.conditions = status.conditions;
        changed(entry);
        clear();
        setLive(true, 'live');
        const kinds = ['EVENT_KIND_INTENT_CHANGED', 'EVENT_KIND_ITEM_STATUS_CHANGED',
          'EVENT_KIND_CONDITIONS_CHANGED', 'EVENT_KIND_AGENT_CONNECTED', 'EVENT_KIND_AGENT_DISCONNECTED'];
        for await (const message of api.watch(name, status.revision, kinds, abort.signal)) {
          backoff = 500;
          if (!message.events) continue;
          for (const event of message.events.events) {
            if (event.conditions_changed) {
              entry.conditions = event.conditions_changed.conditions;
              changed(entry);
            }
          }
          refresh(name);
        }
      } catch (error) {
        if (abort.signal.aborted) return;
        report(error);
        if (['UNAUTHENTICATED', 'PERMISSION_DENIED', 'NOT_FOUND'].includes(error.codeName)) {
          setLive(false, 'denied');
          return;
        }
      }
      setLive(false, 'reconnecting');
      await sleep(backoff, abort.signal);
      backoff = Math.min(backoff * 2, 10000);
    }
  }

  // "Since" columns age: re-render (no call to the server) now and then.
  const clock = setInterval(() => { ageTick += 1; schedule(); }, 5000);
  if (scopedTenant) followTenant(scopedTenant);
  else followFleet();
  changed();

  return {
    dispose() {
      abort.abort();
      clearInterval(clock);
      window.removeEventListener('resize', schedule);
      if (frame) cancelAnimationFrame(frame);
    },
  };
}
