// The dashboard's entry point: sign-in, the error banner, and the views by
// URL fragment (#/ the fleet, #/tenant/NAME a tenant, ?item=TYPE/NAME the
// selected item). The token lives in sessionStorage only: it is gone when
// the tab closes, and no cookie is ever set.

import * as api from './api.js';
import { h, replace } from './dom.js';
import { mountFleet } from './fleet.js';
import { loadSchema } from './proto.js';
import { mountTenant } from './tenant.js';

const main = document.getElementById('main');
const banner = document.getElementById('error');
const who = document.getElementById('who');
const crumbs = document.getElementById('crumbs');
const signOutButton = document.getElementById('sign-out');
let current = null;

/** Shows a failed call's code and the server's own message. */
function report(error) {
  const code = error && error.codeName ? `${error.codeName}: ` : '';
  const message = (error && error.message) || String(error);
  replace(banner, h('b', {}, code), message);
  banner.hidden = false;
}

function clear() {
  banner.hidden = true;
  banner.replaceChildren();
}

function decodePart(part) {
  try {
    return decodeURIComponent(part);
  } catch {
    return part;
  }
}

// Split the fragment before decoding it: names may hold '?', '/', '&' or
// '+', which links carry percent-encoded; decoding first would let them
// split the path or the query (and URLSearchParams decodes its values).
function route() {
  const hash = location.hash.replace(/^#/, '');
  const mark = hash.indexOf('?');
  const path = mark < 0 ? hash : hash.slice(0, mark);
  const query = mark < 0 ? '' : hash.slice(mark + 1);
  const parts = path.split('/').filter(Boolean).map(decodePart);
  const params = new URLSearchParams(query);
  if (parts[0] === 'tenant' && parts.length >= 2) {
    return { view: 'tenant', tenant: parts.slice(1).join('/'), item: params.get('item') || '' };
  }
  return { view: 'fleet' };
}

function signInForm() {
  const token = h('input', { id: 'token', type: 'password', autocomplete: 'off', required: true,
    placeholder: 'rcda_… or rcd_…', 'aria-label': 'Token' });
  const tenant = h('input', { id: 'tenant', type: 'text', autocomplete: 'off',
    placeholder: 'only for a tenant token', 'aria-label': 'Tenant' });
  const form = h('form', { id: 'sign-in', class: 'sign-in' },
    h('h2', {}, 'Sign in'),
    h('p', { class: 'muted' }, 'An admin token shows the whole fleet; a tenant token shows its own tenant. '
      + 'The token stays in this browser tab only.'),
    h('label', {}, 'Token', token),
    h('label', {}, 'Tenant', tenant),
    h('button', { type: 'submit', id: 'sign-in-button' }, 'Sign in'));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    api.session.signIn(token.value.trim(), tenant.value.trim());
    clear();
    if (tenant.value.trim()) location.hash = `#/tenant/${encodeURIComponent(tenant.value.trim())}`;
    show();
  });
  return form;
}

function show() {
  if (current) { current.dispose(); current = null; }
  const signedIn = Boolean(api.session.token);
  signOutButton.hidden = !signedIn;
  if (!signedIn) {
    who.textContent = '';
    replace(crumbs);
    replace(main, signInForm());
    return;
  }
  who.textContent = api.session.tenant ? `tenant ${api.session.tenant}` : 'admin';
  const target = route();
  if (target.view === 'tenant') {
    replace(crumbs, h('a', { href: '#/' }, 'Fleet'), ' / ', h('span', {}, target.tenant));
    current = mountTenant(main, target.tenant, target.item, { report, clear });
  } else {
    replace(crumbs, h('span', {}, 'Fleet'));
    current = mountFleet(main, { report, clear });
  }
}

signOutButton.addEventListener('click', () => {
  api.session.signOut();
  location.hash = '#/';
  clear();
  show();
});

let lastRoute = '';
window.addEventListener('hashchange', () => {
  const next = JSON.stringify(route());
  const { view, tenant } = route();
  const sameTenant = current && current.tenant && view === 'tenant' && current.tenant === tenant;
  if (sameTenant) {
    current.select(route().item);
  } else if (next !== lastRoute) {
    show();
  }
  lastRoute = next;
});

loadSchema()
  .then(() => { lastRoute = JSON.stringify(route()); show(); })
  .catch((error) => report(error));
