// The tenant view (placeholder until the graph lands).
import { h, replace } from './dom.js';

export function mountTenant(root, tenant, item, { report, clear }) {
  void report; void clear;
  replace(root, h('section', { id: 'tenant' }, h('h2', {}, tenant)));
  return { tenant, select() {}, dispose() {} };
}
