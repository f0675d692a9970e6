// Item helpers shared by the tenant view and the item panel: keys,
// labels, enum names without their prefixes, error text, JSON Pointers.

import { CODE_NAMES } from './grpcweb.js';

/** The map key of an item reference. */
export function keyOf(ref) {
  return `${ref.type}\u0000${ref.name}`;
}

/** `type/name`, as items are written everywhere. */
export function label(ref) {
  return `${ref.type}/${ref.name}`;
}

/** An enum value name without its prefix, e.g. CREATED. */
export function short(enumName, prefix) {
  return typeof enumName === 'string' ? enumName.replace(prefix, '') : String(enumName);
}

/** The state of an ItemStatus, e.g. CREATED. */
export const stateOf = (status) => short(status.state, 'ITEM_STATE_');
/** An operation kind in lower case, e.g. create. */
export const kindOf = (kind) => short(kind, 'OPERATION_KIND_').toLowerCase();

/** A google.rpc.Status as `CODE: message`. */
export function errorText(status) {
  if (!status) return '';
  const code = CODE_NAMES[status.code] || `code ${status.code}`;
  return `${code}: ${status.message}`;
}

/** Flattens a JSON value to JSON Pointer -> leaf (objects recurse). */
export function flatten(value, prefix = '', out = new Map()) {
  if (value && typeof value === 'object' && !Array.isArray(value) && Object.keys(value).length) {
    for (const [key, inner] of Object.entries(value)) {
      flatten(inner, `${prefix}/${key.replace(/~/g, '~0').replace(/\//g, '~1')}`, out);
    }
  } else if (prefix) {
    out.set(prefix, JSON.stringify(value));
  }
  return out;
}
