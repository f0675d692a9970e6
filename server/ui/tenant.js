// The tenant view: status, the dependency graph (states coloured,
// subgraphs as clusters, external items marked, blocking edges red), the
// selected item's panel (intended / applied / observed side by side, the
// operation in flight, why it waits, the last error), the operation log and
// the agents. Live through one Reconciler.Watch stream after a GetGraph
// snapshot (see follow()); an item an agent finishes changes colour in
// place.
//
// Large tenants: up to GRAPH_LIMIT items are drawn whole; beyond, the
// graph shows the neighbourhood of the selected item (search to pick one).

import * as api from './api.js';
import { ago, h, iso, replace } from './dom.js';
import { itemChips, stateBadge, summarize } from './fleet.js';
import { drawGraph } from './graph.js';
import { errorText, keyOf, kindOf, label, short, stateOf } from './items.js';
import { errorInfo } from './grpcweb.js';
import { itemPanel } from './panel.js';

const GRAPH_LIMIT = 1500;
const NEIGHBOURHOOD_LIMIT = 300;
const LOG_LIMIT = 500;
const LOG_HISTORY = 2000;
const SEARCH_RESULTS = 50;

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    if (signal) signal.addEventListener('abort', () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

/** Mounts the view of `tenantName` into `root`; returns { tenant, select, dispose }. */
export function mountTenant(root, tenantName, selectedLabel, { report, clear }) {
  const abort = new AbortController();
  const intended = new Map();
  const current = new Map();
  const agents = new Map();
  const log = [];
  let status = null;
  let selected = null;
  let graph = null;
  let needsLayout = true;
  let frame = 0;
  let synced = false;
  let pendingSelection = selectedLabel;

  const head = h('div', { id: 'tenant-head', class: 'tenant-head' }, h('h2', {}, tenantName), 'Loading…');
  const search = h('input', { id: 'item-search', type: 'search', placeholder: 'Search items (type/name)', autocomplete: 'off' });
  const results = h('ul', { id: 'search-results', class: 'search-results' });
  const caption = h('span', { id: 'graph-caption', class: 'muted' });
  const graphBox = h('div', { id: 'graph', class: 'graph-box' });
  const panel = h('aside', { id: 'item-panel', class: 'item-panel' }, h('p', { class: 'muted' }, 'Select an item in the graph.'));
  const logBox = h('section', { id: 'oplog', class: 'oplog' });
  const agentsBox = h('section', { id: 'agents', class: 'agents' });
  const live = h('span', { id: 'tenant-live', class: 'live off' }, 'connecting');
  replace(root, h('section', { id: 'tenant', class: 'tenant', 'data-tenant': tenantName },
    head,
    h('div', { class: 'tenant-body' },
      h('div', { class: 'graph-pane' },
        h('div', { class: 'toolbar' }, search, caption, live), results, graphBox),
      panel),
    h('div', { class: 'tenant-bottom' }, logBox, agentsBox)));

  search.addEventListener('input', renderSearch);

  function schedule() {
    if (!frame) frame = requestAnimationFrame(render);
  }

  function itemRefs() {
    const keys = new Set([...intended.keys(), ...current.keys()]);
    return keys;
  }

  function refOfKey(key) {
    const [type, name] = key.split('\u0000');
    return { type, name };
  }

  function stateOfKey(key) {
    const status = current.get(key);
    if (status) return stateOf(status);
    return intended.has(key) ? 'PENDING' : 'UNKNOWN';
  }

  function model(keys) {
    const nodes = [];
    const edges = [];
    for (const key of keys) {
      const intent = intended.get(key);
      const status = current.get(key);
      const item = intent ? intent.item : status && status.applied;
      const ref = refOfKey(key);
      nodes.push({
        key, type: ref.type, name: ref.name, state: stateOfKey(key),
        external: Boolean((item && item.external) || (status && status.external)),
        orphan: !intent,
        subgraph: item ? item.subgraph : '',
      });
      const blockers = new Set(((status && status.blocked_by) || []).map((b) => keyOf(b.item)));
      for (const dependency of (item && item.dependencies) || []) {
        const from = keyOf(dependency.requires);
        const blocking = blockers.delete(from);
        if (keys.has(from)) edges.push({ from, to: key, blocked: blocking });
      }
      // What blocks it without being a dependency (a dependent's Delete,
      // a Delete of the same type): a dashed red edge from the blocker.
      for (const from of blockers) if (keys.has(from) && from !== key) edges.push({ from, to: key, blocked: true, waits: true });
    }
    return { nodes, edges };
  }

  function neighbourhood(center) {
    // Items within two hops of `center`, both directions, bounded.
    const dependents = new Map();
    for (const [key, intent] of intended) {
      for (const dependency of intent.item.dependencies) {
        const from = keyOf(dependency.requires);
        if (!dependents.has(from)) dependents.set(from, []);
        dependents.get(from).push(key);
      }
    }
    const keys = new Set([center]);
    let frontier = [center];
    for (let hop = 0; hop < 2 && keys.size < NEIGHBOURHOOD_LIMIT; hop++) {
      const next = [];
      for (const key of frontier) {
        const intent = intended.get(key);
        const around = [...((intent && intent.item.dependencies) || []).map((d) => keyOf(d.requires)),
          ...(dependents.get(key) || [])];
        for (const other of around) {
          if (keys.size >= NEIGHBOURHOOD_LIMIT) break;
          if (!keys.has(other) && (intended.has(other) || current.has(other))) { keys.add(other); next.push(other); }
        }
      }
      frontier = next;
    }
    return keys;
  }

  function layout() {
    needsLayout = false;
    const all = itemRefs();
    const started = performance.now();
    let keys = all;
    if (all.size > GRAPH_LIMIT) {
      if (!selected || !all.has(selected)) {
        graph = null;
        replace(graphBox, h('p', { class: 'muted', id: 'graph-too-large' },
          `${all.size.toLocaleString()} items: too many to draw at once. Search for an item to see the graph around it.`));
        caption.textContent = '';
        return;
      }
      keys = neighbourhood(selected);
    }
    if (!keys.size) {
      graph = null;
      replace(graphBox, h('p', { class: 'muted' }, 'No items.'));
      caption.textContent = '';
      return;
    }
    graph = drawGraph(model(keys), { onSelect: (key) => navigate(key) });
    replace(graphBox, graph.element);
    if (selected) {
      graph.select(selected);
      graph.focus(selected);
    }
    const elapsed = Math.round(performance.now() - started);
    graphBox.dataset.drawMs = String(elapsed);
    graphBox.dataset.nodes = String(keys.size);
    caption.textContent = keys === all
      ? `${keys.size.toLocaleString()} items drawn in ${elapsed} ms`
      : `${keys.size} of ${all.size.toLocaleString()} items around ${label(refOfKey(selected))} (${elapsed} ms)`;
  }

  function render() {
    frame = 0;
    if (!synced) return;
    if (pendingSelection !== null) {
      const wanted = pendingSelection;
      pendingSelection = null;
      for (const key of itemRefs()) if (label(refOfKey(key)) === wanted) { selected = key; needsLayout = true; }
    }
    if (needsLayout) layout();
    renderHead();
    renderPanel();
    renderLog();
    renderAgents();
  }

  function renderHead() {
    const conditions = status ? status.conditions : [];
    const { state, condition } = summarize(conditions);
    replace(head,
      h('h2', {}, tenantName),
      stateBadge(state),
      condition ? h('span', { class: 'condition', title: iso(condition.last_transition_time) },
        h('b', {}, condition.reason), ` ${condition.message} · since ${ago(condition.last_transition_time)}`) : '',
      status ? h('span', { class: 'gen', title: 'observed / intended generation' },
        `generation ${status.observed_generation} / ${status.generation}`) : '',
      status ? h('span', { class: 'chips' }, itemChips(status.items_by_state)) : '',
      status && Number(status.operations_in_flight) ? h('span', { class: 'muted' }, `${status.operations_in_flight} in flight`) : '');
  }

  function renderPanel() {
    if (!selected) {
      replace(panel, h('p', { class: 'muted' }, 'Select an item in the graph or search for one.'));
      return;
    }
    replace(panel, itemPanel({
      ref: refOfKey(selected), intent: intended.get(selected), item: current.get(selected),
      state: stateOfKey(selected), link: itemLink,
    }));
  }

  function itemLink(ref) {
    return `#/tenant/${encodeURIComponent(tenantName)}?item=${encodeURIComponent(label(ref))}`;
  }

  function navigate(key) {
    location.hash = itemLink(refOfKey(key));
  }

  function renderLog() {
    const rows = log.slice(-200).reverse().map((entry) => h('tr', { class: entry.error ? 'failed' : '' },
      h('td', { title: iso(entry.time) }, entry.time ? entry.time.toLocaleTimeString() : ''),
      h('td', {}, h('a', { href: itemLink(entry.item) }, label(entry.item))),
      h('td', {}, entry.kind),
      h('td', {}, String(entry.attempt)),
      h('td', {}, entry.what),
      h('td', { class: 'error-text' }, entry.error || '')));
    replace(logBox, h('h3', {}, 'Operation log'),
      rows.length ? h('table', { class: 'log' },
        h('thead', {}, h('tr', {}, ['time', 'item', 'operation', 'attempt', 'outcome', 'error'].map((t) => h('th', {}, t)))),
        h('tbody', {}, rows)) : h('p', { class: 'muted' }, 'No operations yet.'));
  }

  function renderAgents() {
    const types = status ? status.connected_item_types : [];
    replace(agentsBox, h('h3', {}, 'Agents'),
      h('p', {}, types.length ? `Connected item types: ${types.join(', ')}` : 'No item type has a connected agent.'),
      agents.size ? h('ul', { id: 'agent-list' }, [...agents.values()].map((agent) => h('li', { class: agent.connected ? '' : 'muted' },
        h('b', {}, agent.id), ` ${agent.types.join(', ')} — ${agent.connected ? 'connected' : `disconnected (${agent.reason})`} ${ago(agent.since)}`))) : '');
  }

  function renderSearch() {
    const text = search.value.trim().toLowerCase();
    if (!text) { results.replaceChildren(); return; }
    const matches = [];
    for (const key of itemRefs()) {
      const name = label(refOfKey(key));
      if (name.toLowerCase().includes(text)) {
        matches.push(key);
        if (matches.length >= SEARCH_RESULTS) break;
      }
    }
    replace(results, matches.map((key) => h('li', {}, h('a', { href: itemLink(refOfKey(key)) }, label(refOfKey(key)),
      ' ', h('span', { class: `chip item-${stateOfKey(key)}` }, stateOfKey(key).toLowerCase())))));
  }

  function recordOperation(event, time) {
    const started = event.operation_started;
    const finished = event.operation_finished;
    const body = started || finished;
    log.push({
      time, item: body.item, kind: kindOf(body.kind), attempt: body.attempt,
      what: started ? 'started' : short(finished.outcome, 'OUTCOME_').toLowerCase(),
      error: finished && finished.error ? errorText(finished.error) : '',
    });
    if (log.length > LOG_LIMIT) log.splice(0, log.length - LOG_LIMIT);
  }

  function apply(event) {
    if (event.item_status_changed) {
      const change = event.item_status_changed;
      const key = keyOf(change.item);
      const blockers = (status) => (status ? status.blocked_by.map((b) => label(b.item)).join('\n') : '');
      const before = blockers(current.get(key));
      if (change.status) {
        current.set(key, change.status);
      } else if (change.new_state !== 'ITEM_STATE_UNSPECIFIED') {
        // Still current, but its status is over 48 KiB: the stream carries
        // its state and error only (docs/watch.md). Keep the rest as last
        // seen, marked partial, rather than dropping the item as if it had
        // left the graph (it would show PENDING, or vanish).
        current.set(key, partialStatus(current.get(key), change));
      } else {
        current.delete(key);
      }
      const state = stateOfKey(key);
      if (!intended.has(key) && !current.has(key)) {
        // Deleted and no longer intended: its node goes (recolouring it
        // would show an item that no longer exists as UNKNOWN).
        if (graph && graph.has(key)) needsLayout = true;
      } else if (!graph || !graph.setState(key, state)) {
        if (!graph || itemRefs().size <= GRAPH_LIMIT) needsLayout = true;
      }
      // Red edges follow what blocks what: redraw when that changed.
      if (graph && blockers(current.get(key)) !== before) needsLayout = true;
      refreshStatusSoon();
    } else if (event.operation_started || event.operation_finished) {
      recordOperation(event, event.time);
      refreshStatusSoon();
    } else if (event.intent_changed) {
      refreshIntent();
      refreshStatusSoon();
    } else if (event.conditions_changed) {
      if (status) status.conditions = event.conditions_changed.conditions;
      refreshStatus();
    } else if (event.agent_connected || event.agent_disconnected) {
      recordAgent(event);
      refreshStatus();
    }
  }

  // The status of an item whose change came without its full status:
  // the state and error from the event, the rest as last known (nothing
  // if none was), and `partial` set for the panel to say so.
  function partialStatus(known, change) {
    const base = known || {
      ref: change.item, applied: undefined, applied_generation: 0, observed: undefined,
      last_operation: 'OPERATION_KIND_UNSPECIFIED', attempts: 0, next_attempt_at: undefined,
      operation: undefined, pending_operation: 'OPERATION_KIND_UNSPECIFIED',
      reason: 'WAIT_REASON_UNSPECIFIED', blocked_by: [], modifications: 0, external: false,
    };
    return { ...base, state: change.new_state, last_error: change.error, partial: true };
  }

  // Agents by id, from the connect and disconnect events the stream has
  // seen (history included): the API lists connected types, not agents.
  function recordAgent(event) {
    const connected = Boolean(event.agent_connected);
    const agent = event.agent_connected || event.agent_disconnected;
    agents.set(agent.agent_id, {
      id: agent.agent_id, types: agent.item_types, connected, since: event.time,
      reason: connected ? '' : agent.reason,
    });
  }

  // The header's counts (items by state, operations in flight, the
  // generations) change with items and intents, and the conditions do not
  // always change with them: fetch the status again after those events too,
  // at most once per STATUS_INTERVAL_MS, so a busy tenant costs a few
  // GetStatus calls a second, not one per event.
  const STATUS_INTERVAL_MS = 250;
  let statusTimer = null;
  function refreshStatusSoon() {
    if (statusTimer) return;
    statusTimer = setTimeout(() => {
      statusTimer = null;
      if (!abort.signal.aborted) refreshStatus();
    }, STATUS_INTERVAL_MS);
  }

  let statusInFlight = false;
  let statusAgain = false;
  async function refreshStatus() {
    if (statusInFlight) { statusAgain = true; return; }
    statusInFlight = true;
    try {
      do {
        statusAgain = false;
        status = await api.getStatus(tenantName, abort.signal);
        schedule();
      } while (statusAgain);
    } catch (error) {
      if (!abort.signal.aborted) report(error);
    } finally {
      statusInFlight = false;
    }
  }

  let intentInFlight = false;
  let intentAgain = false;
  async function refreshIntent() {
    if (intentInFlight) { intentAgain = true; return; }
    intentInFlight = true;
    try {
      do {
        intentAgain = false;
        const fetched = await api.getGraph(tenantName, 'GRAPH_VIEW_INTENDED', abort.signal);
        intended.clear();
        for (const intent of fetched.intended) intended.set(keyOf(intent.item), intent);
        needsLayout = true;
        schedule();
      } while (intentAgain);
    } catch (error) {
      if (!abort.signal.aborted) report(error);
    } finally {
      intentInFlight = false;
    }
  }

  // One stream per view (browsers allow six HTTP/1.1 connections per
  // origin): the graphs come from GetGraph at revision R, then Watch
  // starts LOG_HISTORY revisions before R, so the operation log opens
  // with recent history; events up to R only feed the log, later ones
  // change the graphs.
  async function follow() {
    let snapshotAt = 0;
    let resumeFrom = 0;
    let backoff = 500;
    while (!abort.signal.aborted) {
      try {
        if (snapshotAt === 0) {
          const fetched = await api.getGraph(tenantName, 'GRAPH_VIEW_BOTH', abort.signal);
          // A new snapshot replaces everything built from events: the
          // graphs, the operation log and the agents (all rebuilt from the
          // history replayed below), and the status (fetched again). What
          // a previous stream saw is stale: an agent it saw connect may
          // have left while no stream was open.
          intended.clear();
          current.clear();
          for (const intent of fetched.intended) intended.set(keyOf(intent.item), intent);
          for (const item of fetched.current) current.set(keyOf(item.ref), item);
          snapshotAt = fetched.revision;
          resumeFrom = Math.max(1, snapshotAt - LOG_HISTORY);
          log.length = 0;
          agents.clear();
          synced = true;
          needsLayout = true;
          live.className = 'live on';
          live.textContent = 'live';
          clear();
          refreshStatus();
          schedule();
        }
        let opened = false;
        for await (const message of api.watch(tenantName, resumeFrom, [], abort.signal)) {
          backoff = 500;
          if (!opened) {
            // A resumed stream (no new snapshot) is live again from its
            // first message (an event group, or a bookmark within 5 s):
            // the break's error no longer holds.
            opened = true;
            live.className = 'live on';
            live.textContent = 'live';
            clear();
          }
          if (message.events) {
            const revision = message.events.revision;
            for (const event of message.events.events) {
              if (revision > snapshotAt) apply(event);
              else if (event.operation_started || event.operation_finished) recordOperation(event, event.time);
              else if (event.agent_connected || event.agent_disconnected) recordAgent(event);
            }
            if (!message.events.continued) resumeFrom = revision;
            schedule();
          } else if (message.bookmark) {
            resumeFrom = Math.max(resumeFrom, message.bookmark.revision);
          }
        }
      } catch (error) {
        if (abort.signal.aborted) return;
        if (error.codeName === 'OUT_OF_RANGE') {
          // History before the snapshot is partly gone: follow from the
          // oldest revision retained (a young tenant's history starts past
          // a floor from the clock, not at 1), else from the snapshot;
          // after the snapshot: take a new snapshot.
          if (resumeFrom < snapshotAt) {
            const info = errorInfo(error);
            const oldest = Number(info && info.metadata && info.metadata.compact_revision);
            resumeFrom = oldest > resumeFrom && oldest < snapshotAt ? oldest : snapshotAt;
          } else {
            snapshotAt = 0;
          }
          continue;
        }
        report(error);
        const info = errorInfo(error);
        if (error.codeName === 'FAILED_PRECONDITION' && info && info.reason === 'TENANT_QUARANTINED') {
          // Its records could not be read: nothing changes until an
          // operator repairs or deletes it, so retrying helps nobody.
          live.className = 'live off';
          live.textContent = 'quarantined';
          replace(head, h('h2', {}, tenantName), h('p', { class: 'muted' },
            'This tenant is quarantined: its records could not be read. Repair it with ' +
            '`reconciled repair` (server stopped) or delete it, then open it again.'));
          return;
        }
        if (['UNAUTHENTICATED', 'PERMISSION_DENIED', 'NOT_FOUND'].includes(error.codeName)) {
          live.className = 'live off';
          live.textContent = 'denied';
          replace(head, h('h2', {}, tenantName), h('p', { class: 'muted' }, 'This tenant cannot be shown.'));
          return;
        }
      }
      live.className = 'live off';
      live.textContent = 'reconnecting';
      await sleep(backoff, abort.signal);
      backoff = Math.min(backoff * 2, 10000);
    }
  }

  follow();
  const clock = setInterval(schedule, 5000);

  return {
    tenant: tenantName,
    select(wanted) {
      pendingSelection = null;
      selected = null;
      for (const key of itemRefs()) if (label(refOfKey(key)) === wanted) selected = key;
      if (!selected) pendingSelection = wanted;
      if (graph && selected && graph.has(selected)) {
        graph.select(selected);
        graph.focus(selected);
      } else {
        needsLayout = true;
      }
      results.replaceChildren();
      schedule();
    },
    dispose() {
      abort.abort();
      clearInterval(clock);
      if (frame) cancelAnimationFrame(frame);
    },
  };
}
