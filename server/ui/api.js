// The calls the dashboard makes, by name: the same Reconciler and Tenants
// RPCs that grpcurl and reconctl use, with the session's bearer token.

import { call, unary } from './grpcweb.js';

const V1 = 'reconciled.v1';

/** The signed-in session: the token and, for a tenant token, its tenant. */
export const session = {
  get token() { return sessionStorage.getItem('reconciled.token') || ''; },
  get tenant() { return sessionStorage.getItem('reconciled.tenant') || ''; },
  signIn(token, tenant) {
    sessionStorage.setItem('reconciled.token', token);
    if (tenant) sessionStorage.setItem('reconciled.tenant', tenant);
    else sessionStorage.removeItem('reconciled.tenant');
  },
  signOut() {
    sessionStorage.removeItem('reconciled.token');
    sessionStorage.removeItem('reconciled.tenant');
  },
};

function options(signal) {
  return { token: session.token, signal };
}

/** Tenants.ListTenants: one page. */
export function listTenants(pageToken, pageSize = 1000, signal) {
  return unary(`/${V1}.Tenants/ListTenants`, `${V1}.ListTenantsRequest`, `${V1}.ListTenantsResponse`,
    { page_size: pageSize, page_token: pageToken || '' }, options(signal));
}

/** Tenants.GetTenant. */
export function getTenant(name, signal) {
  return unary(`/${V1}.Tenants/GetTenant`, `${V1}.GetTenantRequest`, `${V1}.Tenant`,
    { name }, options(signal));
}

/** Tenants.WatchFleet: an async iterator of WatchFleetResponse. */
export function watchFleet(startRevision, signal) {
  return call(`/${V1}.Tenants/WatchFleet`, `${V1}.WatchFleetRequest`, `${V1}.WatchFleetResponse`,
    { start_revision: startRevision }, options(signal));
}

/** Reconciler.GetStatus: the TenantStatus. */
export async function getStatus(tenant, signal) {
  const response = await unary(`/${V1}.Reconciler/GetStatus`, `${V1}.GetStatusRequest`,
    `${V1}.GetStatusResponse`, { tenant }, options(signal));
  return response.status;
}

/** Reconciler.Watch: an async iterator of WatchResponse. */
export function watch(tenant, startRevision, kinds, signal) {
  return call(`/${V1}.Reconciler/Watch`, `${V1}.WatchRequest`, `${V1}.WatchResponse`,
    { tenant, start_revision: startRevision, kinds: kinds || [] }, options(signal));
}

/** Reconciler.GetGraph, every page: { intended, current, revision, generation }. */
export async function getGraph(tenant, view, signal) {
  const result = { intended: [], current: [], revision: 0, generation: 0 };
  let pageToken = '';
  do {
    const page = await unary(`/${V1}.Reconciler/GetGraph`, `${V1}.GetGraphRequest`,
      `${V1}.GetGraphResponse`, { tenant, view, page_token: pageToken }, options(signal));
    result.intended.push(...page.intended);
    result.current.push(...page.current);
    result.revision = page.revision;
    result.generation = page.generation;
    pageToken = page.next_page_token;
  } while (pageToken);
  return result;
}
