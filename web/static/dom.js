// DOM helpers shared by the panels. Everything is built from templates,
// textContent and attributes, never from HTML strings: bucket ids and
// comments are other people's text.

import { describe } from './api.js';

export const $ = (selector, root = document) => root.querySelector(selector);

// h makes an element with attributes and children. Event handler and
// style attributes are refused: the Content-Security-Policy blocks them.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (/^(on|style$)/i.test(name)) throw new Error(`h: attribute ${name} is not allowed`);
    if (value != null && value !== false) el.setAttribute(name, value === true ? '' : value);
  }
  el.append(...children.filter((c) => c != null && c !== ''));
  return el;
}

// fromTemplate clones the first element of the <template> with this id.
export function fromTemplate(id) {
  return document.getElementById(id).content.firstElementChild.cloneNode(true);
}

// fill puts content (text or nodes) into every [data-slot=name] of root.
export function fill(root, name, ...content) {
  for (const el of root.querySelectorAll(`[data-slot="${name}"]`)) {
    el.replaceChildren(...content.map((c) => (c instanceof Node ? c.cloneNode(true) : String(c))));
  }
}

// showProblem writes an API error into a role=alert box: what happened,
// the API's detail, what to do, the field errors no control showed, and
// the request id to quote in a report.
export function showProblem(box, err, { hint, unshown = [], extra } = {}) {
  const d = describe(err);
  box.replaceChildren(
    h('p', { class: 'problem-title' }, d.heading),
    ...(d.detail ? [h('p', {}, d.detail)] : []),
    ...(hint || d.hint ? [h('p', {}, hint || d.hint)] : []),
  );
  if (unshown.length > 0) {
    box.append(h('ul', {}, ...unshown.map((e) => h('li', {}, h('code', {}, e.field), `: ${e.message}`))));
  }
  if (extra) box.append(extra);
  if (err?.requestId) box.append(h('p', { class: 'small' }, `Request id ${err.requestId}`));
  box.hidden = false;
}

export function clearProblem(box) {
  box.hidden = true;
  box.replaceChildren();
}

// clearErrors removes every field error of a form.
export function clearErrors(form) {
  for (const el of form.querySelectorAll('.field-error')) {
    el.hidden = true;
    el.textContent = '';
  }
  for (const el of form.querySelectorAll('[aria-invalid]')) el.removeAttribute('aria-invalid');
}

// showSort shows what of a form or panel applies to one sort of limit
// (format.js sortOf): an element with data-sorts="rate quota" is hidden
// for the other sorts, and one with data-rate, data-quota or
// data-concurrency takes that text (its data-rate one where the sort has
// none), so that a label or a hint says what a field means for each.
// Hiding is all it does: a form also disables what does not apply, so
// that it is not sent.
export function showSort(root, sort) {
  for (const el of root.querySelectorAll('[data-sorts]')) el.hidden = !el.dataset.sorts.split(' ').includes(sort);
  for (const el of root.querySelectorAll('[data-rate], [data-quota], [data-concurrency]')) {
    el.textContent = el.dataset[sort] ?? el.dataset.rate ?? '';
  }
}

// breakable writes a name such as NewOrdersPerAccount with line break
// opportunities between its words, so that a narrow column wraps it at
// "Orders" and "Per" rather than in the middle of a word.
export function breakable(name) {
  const out = [];
  for (const part of name.split(/(?<=[a-z0-9])(?=[A-Z])|(?<=[_.-])/)) {
    if (out.length > 0) out.push(document.createElement('wbr'));
    out.push(part);
  }
  return out;
}

// reportProblem shows an API error for a form: each field error beside its
// control, the rest in the problem box. The focus goes to the first
// invalid control, or else to the problem box, so that the message is in
// view and read out even at the bottom of a long dialog.
export function reportProblem(form, box, err, { hint, extra, toName } = {}) {
  const unshown = showFieldErrors(form, err.fields ?? [], toName);
  showProblem(box, err, { hint, extra, unshown });
  if (document.activeElement?.getAttribute('aria-invalid') !== 'true') focusProblem(box);
}

// focusProblem moves the focus to a shown problem box.
export function focusProblem(box) {
  box.tabIndex = -1;
  box.focus();
}

// showFieldErrors puts each error of a problem beside the control named by
// its field (after toName maps the API's field to a control name), marks
// the control invalid and focuses the first one. It returns the errors
// that no control could show.
export function showFieldErrors(form, errors, toName = (field) => field) {
  const unshown = [];
  let first = null;
  for (const e of errors) {
    const control = form.elements.namedItem(toName(e.field));
    const box = control?.id && document.getElementById(`${control.id}-error`);
    if (!box || control.disabled) {
      unshown.push(e);
      continue;
    }
    box.textContent = box.hidden ? e.message : `${box.textContent} ${e.message}`;
    box.hidden = false;
    control.setAttribute('aria-invalid', 'true');
    first ??= control;
  }
  first?.focus();
  return unshown;
}

// openDialog shows a modal dialog, focuses focusEl (or its first control),
// and, when the dialog closes, gives the focus back through returnFocus,
// which should find the element that opened it even if it was re-rendered.
export function openDialog(dialog, { focusEl, returnFocus } = {}) {
  const opener = document.activeElement;
  dialog.returnFocus = returnFocus ?? (() => opener);
  dialog.showModal();
  (focusEl ?? dialog.querySelector('input:not([disabled]), select:not([disabled]), textarea, button'))?.focus();
}

// initDialogs wires the close buttons of every dialog and the return of
// the focus when one closes, by a button or by Escape. The browser gives
// the focus back to the opener as the dialog closes; returnFocus is for
// when that element is gone (re-rendered or removed) and the focus with
// it. The close event comes later, in a task of its own, possibly after
// the user's next click: where they went, the focus stays.
export function initDialogs() {
  for (const dialog of document.querySelectorAll('dialog')) {
    for (const button of dialog.querySelectorAll('[data-close]')) {
      button.addEventListener('click', () => dialog.close());
    }
    dialog.addEventListener('close', () => {
      const active = document.activeElement;
      if (active && active !== document.body && !dialog.contains(active)) return;
      const target = dialog.returnFocus?.();
      if (target?.isConnected) target.focus();
    });
  }
}

// busy marks a region as loading, for assistive technology and for tests.
export async function busy(region, work) {
  region.setAttribute('aria-busy', 'true');
  try {
    return await work();
  } finally {
    region.removeAttribute('aria-busy');
  }
}

// leftOutKey is the key of a stored row in a map of the rows left out.
export const leftOutKey = (entity, id) => `${entity} ${id}`;

// notInForce marks a row that the service left out of force, with the
// reason it gives; null for a row in force.
export function notInForce(leftOut, entity, id) {
  const reason = leftOut.get(leftOutKey(entity, id));
  return reason === undefined ? null : h('span', { class: 'left-out' }, h('span', { class: 'badge warn' }, 'Not in force'), ` ${reason}`);
}
