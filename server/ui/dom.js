// Building DOM nodes without ever parsing HTML: text goes in as text nodes,
// attributes through setAttribute, so item and tenant names (which may be
// anything a user typed, "<img src=x onerror=alert(1)>" included) are
// always shown as text.

/**
 * h('div', { class: 'row', title: name }, 'text', childNode, [more]) —
 * strings and numbers become text nodes; null/undefined/false are skipped.
 */
export function h(tag, attributes, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      element.addEventListener(key.slice(2), value);
    } else if (key === 'href' && !String(value).startsWith('#')) {
      throw new Error('only in-page links are built');
    } else {
      element.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(element, children);
  return element;
}

/** SVG element with attributes (no children parsing either). */
export function svg(tag, attributes, ...children) {
  const element = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [key, value] of Object.entries(attributes || {})) {
    if (value !== undefined && value !== null) element.setAttribute(key, String(value));
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces every child of `element` with `children`. */
export function replace(element, ...children) {
  element.replaceChildren();
  append(element, children);
}

/** "3 s ago", "5 min ago", ... for a Date; '' for none. */
export function ago(date) {
  if (!(date instanceof Date) || Number.isNaN(date.getTime())) return '';
  const seconds = Math.max(0, Math.round((Date.now() - date.getTime()) / 1000));
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return `${Math.floor(seconds / 86400)} d ago`;
}

/** ISO time for tooltips. */
export function iso(date) {
  return date instanceof Date && !Number.isNaN(date.getTime()) ? date.toISOString() : '';
}
